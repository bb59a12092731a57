"""One writer a database: a second server on a database another holds is refused with one line,
before it can give two results one number (seen: `raas run --out FILE` beside a `raas serve`
both on ./raas.db, and a result that could never be written)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from raas.store.sqlite import DatabaseInUse, ResultStore


async def test_a_second_store_on_a_held_database_is_refused(tmp_path: Path) -> None:
    first, second = ResultStore(tmp_path / "raas.db"), ResultStore(tmp_path / "raas.db")
    await first.open()
    try:
        with pytest.raises(DatabaseInUse, match=r"raas\.db is in use by another raas server"):
            await second.open()
    finally:
        await first.close()
    await second.open()  # the hold went with the first
    await second.close()


async def test_raas_serve_on_a_held_database_says_so_in_one_line(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "raas.db")
    await store.open()
    try:
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "raas", "serve", "--db", str(tmp_path / "raas.db")],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        await store.close()
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        f"Error: {tmp_path / 'raas.db'} is in use by another raas server (or raas run): give this"
        " one a database of its own (--db FILE)"
    )
    assert "Traceback" not in done.stderr
