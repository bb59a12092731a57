"""Driving a sandbox's shell in tests: a command's output, and a background program waited for
until it says it holds what it took (polled against a deadline, never a fixed sleep)."""

from __future__ import annotations

from raas.sandbox import Sandbox

HOLD_DEADLINE_S = 60


async def out(sandbox: Sandbox, command: str) -> str:
    """``command``'s output, stripped; it must exit 0."""
    result = await sandbox.bash(command)
    assert result.exit_code == 0, result.output
    return result.output.strip()


async def hold(sandbox: Sandbox, script: str) -> str:
    """Runs ``script`` (python) in the background in ``sandbox`` until it prints a line that
    starts ``held`` (what it took, which it then keeps): that line."""
    await sandbox.write_file("/tmp/hog.py", script)
    # grep -s: the file may not be there yet (the background shell makes it), and a "No such
    # file" from grep would land in the output, before the line read here.
    wait = (
        "python3 /tmp/hog.py > /tmp/hog.out 2>&1 &"
        f" for i in $(seq {HOLD_DEADLINE_S * 10}); do"
        " grep -qs '^held' /tmp/hog.out && break; sleep 0.1; done; grep -s '^held' /tmp/hog.out"
    )
    return (await out(sandbox, wait)).splitlines()[-1]
