"""Writing a generated bundle, or checking that the committed one is what the generator writes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def render(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)


def write_or_check(
    description: str, out: Path, generate: Callable[[], list[dict[str, Any]]], noun: str
) -> int:
    """The generators' command line: write ``out``, or with --check exit 1 if it is stale."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--check", action="store_true", help="exit 1 if --out is out of date")
    args = parser.parse_args()
    text = render(generate())
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date: run {sys.argv[0]}", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {len(text.splitlines())} {noun} to {args.out}")
    return 0
