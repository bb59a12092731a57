"""A task's repository as raas makes it, and the patch of a tree an agent left, taken cleanly.

Every git command here is a fresh process (``Sandbox.exec``) with a clean environment: no system
or global configuration (the host's /etc/gitconfig is bound into sandboxes, and an agent may
write a ~/.gitconfig), no attributes file, no pager, fixed names and dates. Nothing of it is
typed into a shell an agent used.

The snapshot is materialised as one commit (tag ``base``) in a .git made from an empty template:
the repository holds no history, refs, reflog entries or objects beyond its base, so an agent
finds no later commit to read the fix from.

The patch of an agent's work is taken without trusting anything the agent wrote in .git or in its
shell: the action server reads the working tree as files (``download``: no program of the
agent's runs, no ``git`` function, no diff.external, textconv, clean filter, fsmonitor or hook),
the host keeps its regular files and leaves out .git, bytecode and links, and a sandbox the agent
never touched computes ``git diff`` of them against the snapshot in a .git raas made itself (or,
for a row in its own image, against the commit checked out in a fresh sandbox of that image, with
the image's own .git).
The tree's own .gitattributes and .gitignore still reach git there: with no driver configured
and ``--no-textconv --no-ext-diff --binary`` they can change how a change is written (line
endings, text or binary) or leave out files the agent chose to ignore, never run a program.
A snapshot holds regular files only, so links and other kinds in the tree are left out.
"""

from __future__ import annotations

import asyncio
import base64
import io
import tarfile

from raas.sandbox import ExecResult, Sandbox, SandboxError

REPO = "/workspace/repo"
TREE = "/workspace/tree"  # where the agent's files are put to be compared with the snapshot
BASE_DIR = "/workspace/base"  # the snapshot's .git for that comparison
MAX_TREE_BYTES = 64 * 1024 * 1024  # the agent's files, .git aside
NOT_TREE = [".git", "__pycache__", "*.pyc", "*.pyo"]  # names a tree's snapshot leaves out
MAX_PATCH_BYTES = 32 * 1024 * 1024
GIT_TIMEOUT_S = 120.0
# Python's bytecode is never part of a patch (as a repository's .gitignore would say): an agent
# that ran the tests must not put .pyc files into it.
EXCLUDE = "__pycache__/\n*.py[co]\n"
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "GIT_AUTHOR_NAME": "raas",
    "GIT_AUTHOR_EMAIL": "raas@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
    "GIT_COMMITTER_NAME": "raas",
    "GIT_COMMITTER_EMAIL": "raas@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
}
# One commit on an empty template (no sample hooks), no reflogs, bytecode excluded; a name for
# the agent's own commits and stashes.
MAKE_BASE = (
    "set -e; git -c init.defaultBranch=main init -q --template= .; mkdir -p .git/info;"
    ' printf "$0" > .git/info/exclude; git config core.logAllRefUpdates false;'
    " git config user.email agent@raas; git config user.name agent;"
    " git add -A; git commit -q -m base; git tag base"
)
DIFF = ["diff", "--cached", "--binary", "--no-textconv", "--no-ext-diff", "--no-color"]
DIFF += ["--no-renames"]


class TreeError(Exception):
    """The agent's tree cannot make a patch (too large, unreadable)."""


async def git(
    sandbox: Sandbox,
    *args: str,
    cwd: str = REPO,
    env: dict[str, str] | None = None,
    max_output: int | None = None,
) -> ExecResult:
    return await sandbox.exec(
        ["git", *args],
        cwd=cwd,
        env={**GIT_ENV, **(env or {})},
        timeout_s=GIT_TIMEOUT_S,
        max_output=max_output,
    )


async def materialise(sandbox: Sandbox, files: dict[str, str], at: str = REPO) -> None:
    """The snapshot at ``at`` as a git checkout with one commit, tagged ``base``."""
    for path, content in sorted(files.items()):
        await sandbox.write_file(f"{at}/{path}", content)
    made = await sandbox.exec(
        ["sh", "-c", MAKE_BASE, EXCLUDE], cwd=at, env=GIT_ENV, timeout_s=GIT_TIMEOUT_S
    )
    if made.exit_code != 0:
        raise SandboxError(f"could not make the git checkout: {(made.stdout + made.stderr)[-500:]}")


async def read_tree(agents: Sandbox, at: str = REPO) -> str:
    """The regular files of the tree at ``at`` in the sandbox ``agents``, as a tar (base64),
    read by the action server: nothing the agent wrote runs."""
    # What _regular_files drops is left out in the sandbox too: an image's /testbed carries the
    # repository's whole history, hundreds of MB to pack, send and decode for nothing.
    listing = await agents.call("download", path=at, skip=NOT_TREE, max_bytes=MAX_TREE_BYTES)
    return await asyncio.to_thread(_regular_files, str(listing["tar_b64"]))


async def tree_patch(clean: Sandbox, files: dict[str, str], tree: str) -> str:
    """The patch from the snapshot ``files`` to ``tree`` (``read_tree``), computed in ``clean``,
    a sandbox the agent never touched."""
    await materialise(clean, files, at=BASE_DIR)
    return await _diff(clean, tree, f"{BASE_DIR}/.git", REPO.rsplit("/", 1)[-1], "base")


async def image_tree_patch(clean: Sandbox, tree: str, repo: str) -> str:
    """The patch from the commit checked out at ``repo`` to ``tree`` (``read_tree`` of the same
    path), computed in ``clean``, a fresh sandbox of the same image: its git is the image's own,
    which the agent never touched (what the agent did to its own .git is not read)."""
    return await _diff(clean, tree, f"{repo}/.git", repo.rsplit("/", 1)[-1], "HEAD")


async def _diff(clean: Sandbox, tree: str, git_dir: str, name: str, base: str) -> str:
    """``git diff`` from ``base`` in ``git_dir`` to ``tree``, uploaded into ``clean``."""
    await clean.call("upload", dest=TREE, tar_b64=tree)
    where = {"GIT_DIR": git_dir, "GIT_WORK_TREE": f"{TREE}/{name}"}
    added = await git(clean, "add", "-A", cwd=f"{TREE}/{name}", env=where)
    if added.exit_code != 0:
        raise TreeError(f"git add: {added.stderr[-500:]}")
    diff = await git(
        clean, *DIFF, base, cwd=f"{TREE}/{name}", env=where, max_output=MAX_PATCH_BYTES
    )
    if diff.exit_code != 0 or diff.timed_out:
        raise TreeError(f"git diff: {diff.stderr[-500:]}")
    if diff.stdout_cut_bytes:
        raise TreeError(f"the patch is larger than {MAX_PATCH_BYTES} bytes")
    return diff.stdout


def _regular_files(tar_b64: str) -> str:
    """A tar (base64) of the downloaded tree's regular files: no .git, no bytecode, no links or
    other kinds (a snapshot holds files only), modes 644 or 755."""
    data = base64.b64decode(tar_b64)
    out = io.BytesIO()
    total = 0
    with (
        tarfile.open(fileobj=io.BytesIO(data)) as tar,
        tarfile.open(fileobj=out, mode="w") as kept,
    ):
        for member in tar:
            parts = member.name.split("/")
            if ".git" in parts or "__pycache__" in parts or member.name.endswith((".pyc", ".pyo")):
                continue
            source = tar.extractfile(member) if member.isfile() or member.islnk() else None
            if source is None:
                continue
            content = source.read(MAX_TREE_BYTES - total + 1)
            total += len(content)
            if total > MAX_TREE_BYTES:
                raise TreeError(f"the repository holds more than {MAX_TREE_BYTES} bytes")
            info = tarfile.TarInfo(member.name)
            info.size, info.mode = len(content), 0o755 if member.mode & 0o111 else 0o644
            kept.addfile(info, io.BytesIO(content))
    return base64.b64encode(out.getvalue()).decode()
