"""The exec action: a fresh process from argv, outside the agent's shell (what judges run)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from raas.sandbox import BwrapConfig, Sandbox, SandboxLimits, ToolError, create_sandbox

LIMITS = SandboxLimits(action_timeout_s=30, max_output_bytes=8192, max_processes=64)


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    sb = create_sandbox(BwrapConfig(limits=LIMITS))
    await sb.start()
    yield sb
    await sb.close()


async def test_a_process_gets_its_stdin_and_gives_its_exit_status_and_both_streams(
    sandbox: Sandbox,
) -> None:
    script = "import sys; d = sys.stdin.read(); print(d.upper()); print('e', file=sys.stderr)"
    result = await sandbox.exec(["python3", "-c", script + "; sys.exit(3)"], "hello")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "HELLO\n", "e\n")
    assert not result.timed_out


async def test_what_the_agent_did_to_its_shell_does_not_reach_a_fresh_process(
    sandbox: Sandbox,
) -> None:
    # A `git` function, an alias and an exported variable in the agent's shell: the trick of
    # taking the artifact in the shell the agent used.
    await sandbox.bash("git() { echo 'forged diff'; }; alias python3=true; export LEAK=1")
    assert (await sandbox.bash("git --version")).output.strip() == "forged diff"
    result = await sandbox.exec(["git", "--version"])
    assert result.stdout.startswith("git version")
    env = await sandbox.exec(["env"])
    assert "LEAK" not in env.stdout
    assert sorted(line.split("=")[0] for line in env.stdout.splitlines()) == [
        "HOME",
        "LANG",
        "LC_ALL",
        "PATH",
    ]
    given = await sandbox.exec(["sh", "-c", 'echo "$ONLY"'], env={"ONLY": "this"})
    assert given.stdout == "this\n"


async def test_a_process_that_outlives_its_deadline_is_killed_with_its_group(
    sandbox: Sandbox,
) -> None:
    result = await sandbox.exec(["sh", "-c", "sleep 300 & echo started; sleep 300"], timeout_s=1)
    assert result.timed_out
    left = await sandbox.exec(["sh", "-c", "ps -eo comm | grep -c '^sleep$' || true"])
    assert left.stdout.strip() == "0"


async def test_output_beyond_the_cap_is_cut_and_counted(sandbox: Sandbox) -> None:
    result = await sandbox.exec(["python3", "-c", "print('x' * 100000)"], max_output=1000)
    assert len(result.stdout) == 1000
    assert result.stdout_cut_bytes == 100001 - 1000
    assert result.exit_code == 0


async def test_a_program_cannot_read_the_action_servers_memory_or_environment(
    sandbox: Sandbox,
) -> None:
    """The action server holds what a judge sends it (tests, expected values): a process of
    the same uid in the sandbox must not read it from /proc (it is made non-dumpable)."""
    probe = (
        "import os, sys\n"
        "parent = os.getppid()\n"
        "ok = []\n"
        "for name in ('environ', 'mem', 'fd/0', 'maps'):\n"
        "    try:\n"
        "        open(f'/proc/{parent}/{name}', 'rb').read(1)\n"
        "        ok.append(name)\n"
        "    except OSError:\n"
        "        pass\n"
        "open('/proc/self/environ', 'rb').read(1)  # the control: its own is readable\n"
        "print(','.join(ok) or 'none')\n"
    )
    result = await sandbox.exec(["python3", "-c", probe])
    assert (result.exit_code, result.stdout.strip()) == (0, "none")
    # The agent's shell (a sibling, same uid) is refused too.
    server = (await sandbox.exec(["python3", "-c", "import os; print(os.getppid())"])).stdout
    read = await sandbox.bash(f"head -c1 /proc/{server.strip()}/environ >/dev/null && echo READ")
    assert "READ" not in read.output


async def test_a_bad_request_names_its_field(sandbox: Sandbox) -> None:
    with pytest.raises(ToolError, match="argv"):
        await sandbox.exec([])
    with pytest.raises(ToolError, match="env"):
        await sandbox.exec(["true"], env={"X": 1})  # type: ignore[dict-item]
    missing = await sandbox.exec(["no-such-program"])
    assert missing.exit_code == 127 and "no-such-program" in missing.stderr
