"""What the judges ask of an image's Python before the patch or the tests run: its modules and
the kinds of paths. Written for Python 3.5 or newer (SWE-bench's images of Django 1.x-2.2 have
3.5, of 3.x 3.6): no f-strings, no variable annotations.

``python3 -I probe.py names REPO`` prints, as one JSON object, the directories of REPO on
``sys.path`` and the top-level modules importable from outside it (the standard library, the
image's site-packages): what a patch must not shadow. A judge runs it before the patch is
applied.

``python3 -I probe.py stat`` reads a JSON list of paths (relative to the working directory)
and prints what each is now: ``missing``, ``link``, ``dir``, ``exec``, ``file`` or ``other``.

Standard library only.
"""

import json
import os
import stat
import sys
from typing import Any, Dict, List  # noqa: F401 (Any: in a type comment)

IMPORTABLE = (".py", ".pyc", ".pyo", ".pyw", ".so", ".pyd")


def names(repo: str) -> Dict[str, List[str]]:
    """The repository's directories on sys.path, and every module name importable elsewhere."""
    inside = os.path.realpath(repo)
    roots = []  # type: list[str]
    found = set(sys.builtin_module_names)
    found.update(getattr(sys, "stdlib_module_names", ()))
    for entry in sys.path:
        real = os.path.realpath(entry or ".")
        if real == inside or real.startswith(inside + os.sep):
            roots.append(os.path.relpath(real, inside).replace(os.sep, "/").strip("."))
            continue
        try:
            listing = os.listdir(real)
        except OSError:
            continue  # a zip, or missing: the standard library's names are known already
        for name in listing:
            stem = name.split(".")[0] if name.endswith(IMPORTABLE) else name
            if stem.isidentifier():
                found.add(stem)
    return {"roots": sorted(set(roots)), "names": sorted(found)}


def kind(path: str) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "missing"
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "exec" if mode & 0o111 else "file"
    return "other"


def main() -> None:
    answer = None  # type: Any
    if sys.argv[1:2] == ["names"]:
        answer = names(sys.argv[2])
    elif sys.argv[1:2] == ["stat"]:
        answer = {path: kind(path) for path in json.loads(sys.stdin.read())}
    else:
        sys.exit("usage: probe.py names REPO | stat")
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
