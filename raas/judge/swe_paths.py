"""What a SWE patch may change: the paths it touched, refused or dropped before the tests run.

A patch fixes source code. It is refused (scored 0, the reason in the metrics) when it could
change how the tests are found or run rather than what they test:

- a path that provides a module under a name the tests rely on and the snapshot did not provide
  that way: a top-level module of the standard library or of the image's site-packages (a root
  ``unittest/`` or ``typing.py``), or a test module or its package (``tests/test_x/__init__.py``
  beside ``tests/test_x.py``: a package wins over a module), from any directory of the repository
  that is on ``sys.path``;
- ``sitecustomize`` or ``usercustomize`` modules and ``.pth`` files (run when Python starts),
  package metadata (``*.egg-info``, ``*.dist-info``, ``*.egg-link``: the entry points pytest loads
  plugins from), each in any case (``importlib.metadata`` matches a metadata directory's name
  case-insensitively);
- Python bytecode (an unchecked-hash .pyc is loaded without a look at its source);
- a symbolic link (a test file made a link to the patch's own file).

Every path the patch changed under the tests (a ``tests`` directory at any depth, a top-level
``test`` or ``testing``, ``test_*.py``, ``*_test.py``, ``tests.py``, ``conftest.py``, and the
directories of the tests the task runs) is put back as the snapshot has it, and what the patch
added there is removed: the agent does not pass by editing or adding tests. So is every file a
test runner reads when it starts (``RUNNER_FILES``: pytest's configuration in each of its
names, tox's, setuptools'), one list for every runner: a patch fixes code, it does not choose
which tests run or how.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

IMPORTABLE = (".py", ".pyc", ".pyo", ".pyw", ".so", ".pyd")
STARTUP_MODULES = {"sitecustomize", "usercustomize"}
# Read by a test runner when it starts, wherever they are: which tests run, with which plugins
# and options (pytest 9 reads pytest.toml and .pytest.toml too).
RUNNER_FILES = {
    "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg",
    "pyproject.toml", "conftest.py",
}  # fmt: skip
METADATA = (".egg-info", ".dist-info", ".egg-link")
TEST_FILE = re.compile(r"^(test_.*\.py|.*_test\.py|tests\.py|conftest\.py)$")
SYMLINK, GITLINK = "120000", "160000"


@dataclass(frozen=True)
class Change:
    """One path of ``git diff --raw``: its status (A, M, D, T) and its new mode."""

    status: str
    path: str
    mode: str = "100644"


@dataclass
class Review:
    refused: str | None = None
    restore: list[str] = field(default_factory=list)  # test paths to put back as they were


def parse_raw(output: str) -> list[Change]:
    """``git diff --raw -z --no-renames`` as changes."""
    fields = output.split("\0")
    changes = []
    for head, path in zip(fields[0::2], fields[1::2], strict=False):
        if not head.startswith(":"):
            continue
        _old_mode, new_mode, _old, _new, status = head[1:].split(" ")
        changes.append(Change(status[:1], path, new_mode))
    return changes


def test_modules(test_ids: list[str], files: set[str]) -> dict[str, str]:
    """The module of each test id found among the snapshot's ``files``: module -> its path."""
    found: dict[str, str] = {}
    for test_id in test_ids:
        parts = test_id.split(".")
        for end in range(len(parts) - 1, 0, -1):
            stem = "/".join(parts[:end])
            path = next((p for p in (f"{stem}.py", f"{stem}/__init__.py") if p in files), None)
            if path is not None:
                found[".".join(parts[:end])] = path
                break
    return found


def is_test_path(path: str, test_dirs: set[str]) -> bool:
    """A test file, a file of the tests' directories, or a file the runner reads at start."""
    parts = path.split("/")
    if parts[-1] in RUNNER_FILES:
        return True
    if "tests" in parts or parts[0] in {"test", "testing"} or TEST_FILE.match(parts[-1]):
        return True
    return any(path.startswith(d + "/") for d in test_dirs)


def providers(path: str, roots: list[str]) -> set[tuple[str, str]]:
    """(dotted module name, the directory or file that provides it) for ``path``, from each
    directory of the repository on sys.path (``""``: the repository's root)."""
    found = set()
    for root in roots:
        if root and not path.startswith(root + "/"):
            continue
        rel = path[len(root) + 1 :] if root else path
        *dirs, leaf = rel.split("/")
        base = root + "/" if root else ""
        for i in range(1, len(dirs) + 1):
            found.add((".".join(dirs[:i]), base + "/".join(dirs[:i]) + "/"))
        stem = leaf.split(".")[0]
        if "." in leaf and leaf.endswith(IMPORTABLE) and stem:
            found.add((".".join([*dirs, stem]), base + rel))
    return found


def review(
    changes: list[Change],
    files: set[str],
    test_ids: list[str],
    shadowable: set[str],
    roots: list[str],
) -> Review:
    """The patch's ``changes`` to the snapshot's ``files``: refused, or the test paths to put
    back. ``shadowable``: the top-level modules importable from outside the repository."""
    modules = test_modules(test_ids, files)
    protected = {m for name in modules for m in _prefixes(name)}
    had = {p for f in files for p in providers(f, roots)}
    test_dirs = {path.rsplit("/", 1)[0] for path in modules.values() if "/" in path}
    for change in changes:
        if change.status == "D":
            continue
        why = _refusal(change, roots, shadowable, protected, had)
        if why is not None:
            return Review(refused=f"{change.path}: {why}")
    restore = [c.path for c in changes if is_test_path(c.path, test_dirs)]
    return Review(restore=sorted(restore))


def _refusal(
    change: Change,
    roots: list[str],
    shadowable: set[str],
    protected: set[str],
    had: set[tuple[str, str]],
) -> str | None:
    path = change.path
    parts = path.split("/")
    if change.mode in (SYMLINK, GITLINK) or change.status == "T":
        return "a patch may not add symbolic links or submodules"
    if "__pycache__" in parts or path.endswith((".pyc", ".pyo")):
        return "a patch may not hold Python bytecode"
    lowered = [part.lower() for part in parts]
    if lowered[-1].endswith(".pth") or lowered[-1].split(".")[0] in STARTUP_MODULES:
        return "a patch may not add code that Python runs at its start"
    if any(part.endswith(METADATA) for part in lowered):
        return "a patch may not write package metadata (pytest loads plugins from it)"
    for name, provider in providers(path, roots):
        if (name, provider) in had:
            continue
        if name in protected:
            return f"it would shadow the test module {name}"
        if "." not in name and name in shadowable:
            return f"it would shadow the module {name} outside the repository"
    return None


def _prefixes(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
