"""The candidate's process: loads the solution and calls its function on request.

Started by a judge (``python3 -I candidate.py SOLUTION NAME``) with pipes for stdin and stdout;
its modules (this one, values.py) are imported before the solution runs, so nothing the solution
does to their files changes what already runs. Requests are JSON lines ``{"id", "args"}``
(tagged values, see values.py); each answer is ``{"id", "value"}`` or ``{"id", "error"}`` on the
protocol channel, the stdout this process was started with: the solution's prints go to
/dev/null.
The judge's tests, expected values and pass mark never enter this process.

Standard library only, Python 3.8 or newer.
"""

from __future__ import annotations

import json
import os
import sys
import types
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from values import Unsupported, decode, encode


def channel() -> Any:
    """The protocol's stream: a copy of stdout, before stdout goes to /dev/null."""
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115  (for good)
    return proto


def load(path: str, name: str) -> Callable[..., Any]:
    """The solution's function ``name``: top level, or a method of a ``Solution`` class."""
    module = types.ModuleType("solution")
    module.__file__ = path
    sys.modules["solution"] = module
    with open(path, encoding="utf-8") as f:
        code = compile(f.read(), path, "exec")
    exec(code, module.__dict__)
    fn = getattr(module, name, None)
    if fn is None and hasattr(module, "Solution"):
        fn = getattr(module.Solution(), name, None)
    if not callable(fn):
        raise LookupError(f"the solution defines no function {name!r}")
    return fn  # type: ignore[no-any-return]


def answer(fn: Callable[..., Any], request: Any) -> Any:
    try:
        args = decode(request["args"])
        if type(args) is not list:
            raise Unsupported("args must be a list")
        return {"id": request["id"], "value": encode(fn(*args))}
    except BaseException as e:
        return {"id": request.get("id"), "error": f"{type(e).__name__}: {e}"}


def main() -> None:
    path, name = sys.argv[1], sys.argv[2]
    proto = channel()
    try:
        fn = load(path, name)
    except BaseException as e:
        proto.write(json.dumps({"id": None, "error": f"{type(e).__name__}: {e}"}) + "\n")
        proto.flush()
        return
    for line in sys.stdin:
        reply = answer(fn, json.loads(line))
        proto.write(json.dumps(reply) + "\n")
        proto.flush()


if __name__ == "__main__":
    main()
