"""What every command shares: calling a server from the command line, and logging."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

import click

T = TypeVar("T")


def run_client(coro: Coroutine[Any, Any, T]) -> T:
    """Run a client coroutine; a server's error or an unreachable server is one line."""
    from raas.client import RaasHTTPError

    try:
        return asyncio.run(coro)
    except RaasHTTPError as e:
        raise click.ClickException(str(e)) from e
    except OSError as e:
        raise click.ClickException(f"cannot reach the server: {e}") from e


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
