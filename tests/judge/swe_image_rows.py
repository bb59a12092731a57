"""A small real Python project with a bug, as a SWE-Gym-format row: its files at a base commit,
the gold patch, the instance's test patch, its FAIL_TO_PASS / PASS_TO_PASS node ids, and
patches made from edits of it (for sabotage). The image tier builds its images from the same
project (``write_repo`` into the image's ``/testbed``), so a row here runs there as it is.

The bug: ``stats.mean`` divides by ``len(xs) - 1``. ``tests/test_stats.py::test_mean`` fails on
it at the base commit; the test patch adds ``TestMean::test_single``, which fails there too
(a division by zero). ``test_add`` and ``test_clamp`` pass before and after.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raas.images.image import StoredImage

ROOTFS = Path(os.environ.get("RAAS_CACHE_DIR") or Path.home() / ".cache" / "raas")
ROOTFS = ROOTFS / "swe-images" / "base-rootfs"


def base_image() -> StoredImage:
    """The base root filesystem as a one-layer image: its sandbox's root is an overlay that root
    mounts, so the sandbox's uid need not reach the cache directory."""
    return StoredImage("raas-test/base", "sha256:" + "0" * 64, (ROOTFS,))


SOURCE = "stats.py"
TESTS = "tests/test_stats.py"
BUG = "return sum(xs) / (len(xs) - 1)"
FIX = "return sum(xs) / len(xs)"

FILES: dict[str, str] = {
    "README.md": "# stats\n\nSmall statistics helpers.\n",
    SOURCE: (
        '"""Small statistics helpers."""\n\n\n'
        "def add(a, b):\n    return a + b\n\n\n"
        "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n\n\n"
        f"def mean(xs):\n    {BUG}\n"
    ),
    TESTS: (
        "from stats import add, clamp, mean\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_clamp():\n    assert clamp(5, 0, 3) == 3\n\n\n"
        "def test_mean():\n    assert mean([1, 2, 3]) == 2\n"
    ),
}
# What the instance's test patch adds (SWE-bench applies it after the agent's patch).
TEST_PATCH_TESTS = FILES[TESTS] + (
    "\n\nclass TestMean:\n    def test_single(self):\n        assert mean([4]) == 4\n"
)
FAIL_TO_PASS = [f"{TESTS}::test_mean", f"{TESTS}::TestMean::test_single"]
PASS_TO_PASS = [f"{TESTS}::test_add", f"{TESTS}::test_clamp"]
INSTANCE_ID = "raas-tests__stats-1"


def git(cwd: Path, *args: str) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
    }
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return done.stdout


def write_repo(root: Path, files: Mapping[str, str] = FILES) -> str:
    """``files`` at ``root`` as a git repository of one commit; its sha (the base commit)."""
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    git(root, "-c", "init.defaultBranch=main", "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    return git(root, "rev-parse", "HEAD").strip()


def patch_of(
    changes: Mapping[str, str | bytes | None],
    symlinks: Mapping[str, str] | None = None,
    *,
    files: Mapping[str, str] = FILES,
) -> str:
    """The git patch from ``files`` to ``files`` with ``changes`` (None deletes; ``symlinks``:
    path -> target), as ``git diff --binary`` writes it."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_repo(root, files)
        for path, content in changes.items():
            target = root / path
            if content is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content)
        for path, link in (symlinks or {}).items():
            (root / path).unlink(missing_ok=True)
            (root / path).symlink_to(link)
        git(root, "add", "-A", "-f")
        return git(root, "diff", "--cached", "--binary", "HEAD")


def fixed(text: str = FILES[SOURCE]) -> str:
    return text.replace(BUG, FIX)


GOLD_PATCH = patch_of({SOURCE: fixed()})
TEST_PATCH = patch_of({TESTS: TEST_PATCH_TESTS})


def base_commit() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        return write_repo(Path(tmp))


def row(**extra: Any) -> dict[str, Any]:
    """The project as a SWE-Gym row (lists as JSON text, no image: SWE-Gym's name for it)."""
    return {
        "instance_id": INSTANCE_ID,
        "repo": "raas-tests/stats",
        "base_commit": base_commit(),
        "version": "1.0",
        "problem_statement": "mean() of [1, 2, 3] is 3, not 2; mean([4]) divides by zero.",
        "patch": GOLD_PATCH,
        "test_patch": TEST_PATCH,
        "FAIL_TO_PASS": json.dumps(FAIL_TO_PASS),
        "PASS_TO_PASS": json.dumps(PASS_TO_PASS),
        **extra,
    }
