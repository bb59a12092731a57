"""A fork carries its parent shell's directory and exported variables as data, never as code
(issue 43, class 5): whatever the agent defines or prints in its shell (functions or aliases
named like the builtins the reader uses, traps, prompts, values that look like commands) runs
nothing in the child, and the child still gets the parent's directory and variables.

Every attack plants a command (``touch /tmp/pwned``) where a reader or restorer that treats the
shell's text as code would run it; the checks look for the file with a fresh process
(``exec``), outside both shells. Each has a one-line comment; the controls show what must still
arrive."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from raas.sandbox import BwrapConfig, Sandbox, SandboxLimits, create_sandbox
from raas.sandbox.fork import MAX_VARIABLES, VALUE_BYTES, ShellState, read_shell_command
from raas.tasks import TaskRegistry
from raas.tasks.services import TaskServices
from raas.wire import Branch
from tests.conftest import small_config
from tests.pipeline.test_branch import FINISH, Branchy, Scripts, bash, run_job

MiB = 1024 * 1024
LIMITS = SandboxLimits(action_timeout_s=30, max_processes=64, disk_bytes=64 * MiB)
DIR = "/workspace/a dir/ü"
PLANTED = "touch /tmp/pwned"
# What the child's shell is asked: its directory, the parent's variables, LANG (unset there).
LOOK = (
    'builtin printf "%s\\n" "$PWD" "$V" "$W" "${LANG-unset}"'
    ' "$(builtin type -t export printf builtin)"'
)


@contextlib.asynccontextmanager
async def started(sandbox: Sandbox) -> AsyncIterator[Sandbox]:
    try:
        if not sandbox.client:
            await sandbox.start()
        yield sandbox
    finally:
        await sandbox.close()


@pytest.fixture
async def parent() -> AsyncIterator[Sandbox]:
    async with started(create_sandbox(BwrapConfig(limits=LIMITS))) as sb:
        setup = await sb.bash(
            f"mkdir -p '{DIR}' && cd '{DIR}' && export V='x y' W='ünï = \"q\"' && unset LANG"
        )
        assert setup.exit_code == 0, setup.output
        yield sb


async def exists(sandbox: Sandbox, path: str) -> bool:
    """Whether ``path`` is there, asked by a fresh process (no agent's shell in between)."""
    return (await sandbox.exec(["test", "-e", path])).exit_code == 0


async def pwned(sandbox: Sandbox) -> bool:
    return await exists(sandbox, "/tmp/pwned") or await exists(sandbox, "/workspace/pwned")


async def assert_carried_as_data(parent: Sandbox, child: Sandbox) -> None:
    """The child has the parent's directory and variables, and nothing planted ran anywhere."""
    seen = await child.bash(LOOK)
    assert seen.output.split("\n")[:4] == [DIR, "x y", 'ünï = "q"', "unset"]
    assert seen.output.split("\n")[4:7] == ["builtin", "builtin", "builtin"]  # no functions
    assert not await pwned(child)
    assert not await pwned(parent)


# Functions named like what a reader or restorer of the shell would call, each printing a
# command where it is called (the old reader replayed what `export -p` printed).
PRINTING = {
    "export": 'export() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin export "$@"; }',
    "declare": 'declare() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin declare "$@"; }',
    "typeset": 'typeset() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin typeset "$@"; }',
    "printf": 'printf() { builtin printf "$@"; builtin echo "/usr/bin/touch /tmp/pwned"; }',
    "cd": 'cd() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin cd "$@"; }',
    "pwd": 'pwd() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin pwd "$@"; }',
    "compgen": 'compgen() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin compgen "$@"; }',
    "eval": 'eval() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin eval "$@"; }',
    "set": 'set() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin set "$@"; }',
    "shift": 'shift() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin shift "$@"; }',
    "unset": 'unset() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin unset "$@"; }',
    "unalias": 'unalias() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin unalias "$@"; }',
    "trap": 'trap() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin trap "$@"; }',
    "command": 'command() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin command "$@"; }',
    "env": 'env() { builtin echo "/usr/bin/touch /tmp/pwned"; command env "$@"; }',
    # The escape hatch itself: `builtin` as a function shadows every `builtin X`.
    "builtin": 'builtin() { echo "/usr/bin/touch /tmp/pwned"; command builtin "$@"; }',
}


@pytest.mark.parametrize("name", sorted(PRINTING))
async def test_a_function_that_prints_a_command_runs_nothing_in_the_fork(
    parent: Sandbox, name: str
) -> None:
    # A function named like a builtin the reader might use prints a command into what it reads.
    assert (await parent.bash(PRINTING[name])).exit_code == 0
    async with started(await parent.fork()) as child:
        await assert_carried_as_data(parent, child)
    # The reader ran in a subshell: the parent's shell still has its function.
    assert "function" in (await parent.bash(f"type -t {name}")).output


# The same names, each function running the command itself wherever it is called (printf and
# source are left out: the action server's own wrapper calls them after every command).
RUNNING = [n for n in sorted(PRINTING) if n not in ("printf", "builtin")]


@pytest.mark.parametrize("name", RUNNING)
async def test_a_function_that_runs_a_command_is_never_called_by_a_fork(
    parent: Sandbox, name: str
) -> None:
    # e.g. export() { touch /tmp/pwned; builtin export "$@"; }: the reader calls no function.
    define = f'{name}() {{ {PLANTED}; builtin {name} "$@"; }}'
    if name == "env":
        define = f'env() {{ {PLANTED}; command env "$@"; }}'
    assert (await parent.bash(define)).exit_code == 0
    async with started(await parent.fork()) as child:
        await assert_carried_as_data(parent, child)


ALIASES = {
    # An alias of export (aliases expand in the shell's sourced commands).
    "export": "alias export='builtin echo \"/usr/bin/touch /tmp/pwned\"; builtin export'",
    # An alias of printf.
    "printf": "alias printf='builtin echo \"/usr/bin/touch /tmp/pwned\"; builtin printf'",
    # Aliases of reserved words change how a loop is parsed, not only commands.
    "while": "alias while='builtin echo \"/usr/bin/touch /tmp/pwned\"; while'",
    # An alias of for.
    "for": "alias for='builtin echo \"/usr/bin/touch /tmp/pwned\"; for'",
    # An alias of the quoted-looking builtin name itself.
    "builtin": "alias builtin='echo \"/usr/bin/touch /tmp/pwned\"; command builtin'",
}


@pytest.mark.parametrize("name", sorted(ALIASES))
async def test_an_alias_runs_nothing_in_the_fork(parent: Sandbox, name: str) -> None:
    # shopt -s expand_aliases, then an alias that prints a command.
    made = await parent.bash(f"shopt -s expand_aliases\n{ALIASES[name]}")
    assert made.exit_code == 0, made.output
    async with started(await parent.fork()) as child:
        await assert_carried_as_data(parent, child)
    assert name in (await parent.bash("command alias")).output  # the parent keeps its alias


SHELL_TRICKS = {
    # A DEBUG trap inherited by subshells (set -T) prints a command before each one.
    "debug-trap": "set -T; trap 'builtin echo \"/usr/bin/touch /tmp/pwned\"' DEBUG",
    # Tracing prints each command the reader runs, a planted one among its words.
    "xtrace": "set -x; X='touch /tmp/pwned'",
    # An odd IFS would split the reader's list of names wrongly.
    "ifs": "IFS=x",
    # nounset would stop the reader at a variable exported without a value.
    "nounset": "set -u; export NO_VALUE",
    # POSIX mode changes which builtins functions may shadow.
    "posix": "set -o posix",
}


@pytest.mark.parametrize("name", sorted(SHELL_TRICKS))
async def test_traps_and_options_of_the_shell_do_not_shape_the_fork(
    parent: Sandbox, name: str
) -> None:
    # Shell options and traps the agent set: the reader turns them off in its subshell.
    assert (await parent.bash(SHELL_TRICKS[name])).exit_code == 0
    async with started(await parent.fork()) as child:
        await assert_carried_as_data(parent, child)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        # PROMPT_COMMAND runs after every command of an interactive shell: it is not carried.
        ("PROMPT_COMMAND", "[ -e /tmp/child ] && touch /tmp/pwned"),
        # PS1 is expanded (command substitution included) at every prompt: not carried.
        ("PS1", "$([ -e /tmp/child ] && touch /tmp/pwned)"),
        # PS0 is expanded before every command: not carried.
        ("PS0", "$([ -e /tmp/child ] && touch /tmp/pwned)"),
    ],
)
async def test_variables_the_shell_runs_as_code_are_not_carried(
    parent: Sandbox, variable: str, value: str
) -> None:
    # The code runs only where /tmp/child exists: in the child, once the test makes it there.
    assert (await parent.bash(f"export {variable}='{value}'")).exit_code == 0
    async with started(await parent.fork()) as child:
        first = await child.bash("touch /tmp/child")
        assert first.note is not None and f"{variable} (read by the shell itself)" in first.note
        await child.bash("true")  # a prompt (and its code) after /tmp/child exists
        assert not await exists(child, "/tmp/pwned")
        assert (await child.bash(f'echo "${{{variable}-unset}}"')).output.strip() != value
        await assert_carried_as_data(parent, child)


VALUES = {
    "substitution": "$(/usr/bin/touch /tmp/pwned)",
    "backticks": "`/usr/bin/touch /tmp/pwned`",
    "newline-command": "x\n/usr/bin/touch /tmp/pwned\ny",
    "blank-lines": "a\n\n\nb\n",
    "single-quotes": "'; /usr/bin/touch /tmp/pwned; '",
    "double-quotes": '"; /usr/bin/touch /tmp/pwned; "',
    "declare-line": '"\ndeclare -x Z="$(/usr/bin/touch /tmp/pwned)"\n',
    "backslashes": "\\\\'\\\"\\$(x)\\n",
    "percent-and-escapes": "%s %n \\0 \\x41 \t end",
    "carriage-return": "a\r\nb\r",
    "looks-like-a-marker": "raas-shell-0123456789abcdef-end",
    "empty": "",
}


async def test_values_that_look_like_commands_arrive_verbatim_and_run_nothing(
    parent: Sandbox,
) -> None:
    # Each value is exported from bytes the shell decodes itself (no quoting by the test).
    names = {key: f"VAL_{i}" for i, key in enumerate(VALUES)}
    # (An X after each keeps the trailing newlines that $(...) would strip.)
    lines = [
        f'{names[k]}="$(echo {base64.b64encode(v.encode()).decode()} | base64 -d; echo X)";'
        f' export {names[k]}="${{{names[k]}%X}}"'
        for k, v in VALUES.items()
    ]
    assert (await parent.bash("\n".join(lines))).exit_code == 0
    async with started(await parent.fork()) as child:
        for key, value in VALUES.items():
            got = await child.bash(f'builtin printf %s "${names[key]}" | base64 -w0')
            assert base64.b64decode(got.output.strip()).decode() == value, key
        await assert_carried_as_data(parent, child)


async def test_a_directory_named_like_commands_is_entered_not_run(parent: Sandbox) -> None:
    # A directory whose name holds a newline and a command (the old reader split it in two).
    odd = "/tmp/d\n/usr/bin/touch /tmp/pwned\n$(/usr/bin/touch /tmp/pwned)"
    made = await parent.bash(
        "d=$(printf '/tmp/d\\n/usr/bin/touch /tmp/pwned\\n$(/usr/bin/touch /tmp/pwned)')"
        ' && mkdir -p "$d" && cd "$d"'
    )
    assert made.exit_code == 0, made.output
    async with started(await parent.fork()) as child:
        got = await child.bash("pwd | base64 -w0")
        assert base64.b64decode(got.output.strip()).decode() == odd + "\n"
        assert not await pwned(child)


async def test_a_huge_value_is_dropped_and_the_rest_carried(parent: Sandbox) -> None:
    # A value too long for any program (and every later exec in the parent fails on E2BIG).
    made = await parent.bash(
        f"BIG=$(head -c {VALUE_BYTES + 10} /dev/zero | tr '\\0' a); export BIG"
    )
    assert made.exit_code == 0, made.output
    async with started(await parent.fork()) as child:
        first = await child.bash('echo "${BIG-unset}"')
        assert first.output.strip() == "unset"
        assert first.note is not None and f"BIG (its value is over {VALUE_BYTES} bytes)" in (
            first.note
        )
        await assert_carried_as_data(parent, child)


async def test_a_value_at_the_cap_is_carried(parent: Sandbox) -> None:
    # Control: the longest value carried arrives whole.
    made = await parent.bash(
        f"export EDGE=$(head -c {VALUE_BYTES // 2} /dev/zero | tr '\\0' x | sed s/x/é/g)"
    )
    assert made.exit_code == 0, made.output
    async with started(await parent.fork()) as child:
        got = await child.bash('echo "${#EDGE}"')  # characters of two bytes each
        assert got.output.strip() == str(VALUE_BYTES // 2)
        assert got.note is None


async def test_too_much_in_all_keeps_the_childs_own_environment_not_fatal(
    parent: Sandbox,
) -> None:
    # Variables over the reader's whole output cap (here 40 of 120 KiB): none carried, no error.
    made = await parent.bash(
        "x=$(head -c 120000 /dev/zero | tr '\\0' a); for i in {1..40}; do export \"M$i=$x\"; done"
    )
    assert made.exit_code == 0, made.output
    async with started(await parent.fork()) as child:
        first = await child.bash('printf "%s|%s|%s\\n" "$PWD" "${M1-unset}" "${LANG-unset}"')
        # The directory still is the parent's; the variables are the child's own (LANG too).
        assert first.output.strip() == f"{DIR}|unset|C.UTF-8"
        assert first.note is not None and "its exported variables (over" in first.note
        assert not await pwned(child)


async def test_ordinary_variables_and_a_directory_with_spaces_survive(parent: Sandbox) -> None:
    # Control: plain variables (spaces, unicode, '=', empty), an unset one, and the directory.
    made = await parent.bash(
        "export PLAIN=1 SPACED='a  b   c' UNI='日本語 ✓' EQ='k=v=w' EMPTY= ; unset HOME"
    )
    assert made.exit_code == 0, made.output
    async with started(await parent.fork()) as child:
        got = await child.bash(
            'printf "%s|" "$PLAIN" "$SPACED" "$UNI" "$EQ" "${EMPTY-unset}" "${HOME-unset}"; pwd'
        )
        assert got.output.strip() == f"1|a  b   c|日本語 ✓|k=v=w||unset|{DIR}"
        assert got.note is None  # nothing to say: everything was carried
        await assert_carried_as_data(parent, child)
        # The child forked again carries the same (a fork of a fork).
        async with started(await child.fork()) as grandchild:
            again = await grandchild.bash('printf "%s|" "$SPACED" "$UNI"; pwd')
            assert again.output.strip() == f"a  b   c|日本語 ✓|{DIR}"


async def test_a_directory_missing_in_the_child_leaves_it_in_its_own(parent: Sandbox) -> None:
    # Not fatal: /dev/shm is the sandbox's own and not copied, so the child has no such place.
    assert (await parent.bash("mkdir -p /dev/shm/here && cd /dev/shm/here")).exit_code == 0
    async with started(await parent.fork()) as child:
        first = await child.bash('printf "%s|%s\\n" "$PWD" "$V"')
        assert first.output.strip() == "/workspace|x y"
        assert first.note is not None and "/dev/shm/here" in first.note


def test_names_the_shell_cannot_carry_are_dropped_not_fatal() -> None:
    # Forged records (a reader fooled into printing them): bad names, no '=', a special name.
    nonce = "ab12"
    records = [
        "GOOD=1",
        "1BAD=x",
        "A-B=x",
        "A B=x",
        "=x",
        "$(touch /tmp/pwned)=x",
        "NOEQUALS",
        "SHELLOPTS=xtrace",
        "BASH_ENV=/tmp/evil",
        "PWD=/etc",
        "ALSO_GOOD=it's",
    ]
    output = f"noise\nraas-shell-{nonce}-begin\0/w d\n\0" + "\0".join(records) + "\0"
    output += f"raas-shell-{nonce}-end\0trailing noise"
    state = ShellState.parse(output, nonce)
    assert state.cwd == "/w d"
    assert state.env == (("GOOD", "1"), ("ALSO_GOOD", "it's"))
    assert len(state.dropped) == 8  # six bad names, SHELLOPTS, BASH_ENV; PWD quietly
    command = state.restore_command()
    assert "\\builtin export GOOD=1\n\\builtin export ALSO_GOOD='it'\"'\"'s'\n" in command
    assert command.endswith(
        "\\builtin cd -- '/w d' 2>/dev/null || \\builtin printf '%s\\n'"
        " 'raas-fork: no such directory'"
    )


def test_what_cannot_be_read_is_not_carried() -> None:
    # No markers (a shell that printed something else), no end marker, a relative directory.
    assert ShellState.parse("declare -x A=1\n", "ab").env is None
    cut = ShellState.parse("raas-shell-ab-begin\0/w\n\0A=1\0", "ab")
    assert cut.cwd == "/w" and cut.env is None and cut.dropped
    relative = ShellState.parse("raas-shell-ab-begin\0w\n\0A=1\0raas-shell-ab-end\0", "ab")
    assert relative.cwd is None and relative.env == (("A", "1"),)
    assert "builtin cd" not in relative.restore_command()
    whole = ShellState.parse("raas-shell-ab-begin\0/w\n\0A=1\0raas-shell-ab-end\0", "ab", False)
    assert whole.env is None and "its exported variables (over" in whole.dropped[0]


def test_too_many_variables_are_capped() -> None:
    records = "".join(f"V{i}=x\0" for i in range(MAX_VARIABLES + 5))
    state = ShellState.parse(f"raas-shell-ab-begin\0/\n\0{records}raas-shell-ab-end\0", "ab")
    assert state.env is not None and len(state.env) == MAX_VARIABLES
    assert len(state.dropped) == 5


def test_the_reader_takes_only_a_hexadecimal_nonce() -> None:
    with pytest.raises(ValueError):
        read_shell_command("x'; touch /tmp/pwned; '")


@pytest.fixture
async def branches(tmp_path: Path) -> AsyncIterator[tuple[Any, TaskServices]]:
    from raas.llm.models import load_tokenizer
    from raas.pipeline import Pipeline
    from raas.store.sqlite import ResultStore

    attack = (
        'export() { builtin echo "/usr/bin/touch /tmp/pwned"; builtin export "$@"; };'
        f" echo one >> /workspace/f; mkdir -p '{DIR}' && cd '{DIR}' && export V='x y'"
    )
    look = 'printf "%s|" "$PWD" "$V"; test -e /tmp/pwned && echo PWNED || echo CLEAN'
    policy = Scripts(
        load_tokenizer("smollm2"),
        {"parent": [bash(attack), bash("true"), FINISH], "branch": [bash(look), FINISH]},
    )
    services = TaskServices(llm=policy, sandbox_config=BwrapConfig())
    registry = TaskRegistry()
    registry.register(Branchy())
    store = ResultStore(tmp_path / "raas.db")
    await store.open()
    pipeline = Pipeline(registry, store, small_config(), services=services)
    await pipeline.start()
    try:
        yield pipeline, services
    finally:
        await pipeline.stop(grace_s=0)
        await services.close()
        await store.close()


async def test_a_branch_from_a_snapshot_gets_the_shell_as_data(
    branches: tuple[Any, TaskServices],
) -> None:
    # The agent's turn 1 defines an export function; its snapshot, and a branch forked from
    # that, carry the directory and variables and run nothing.
    pipeline, _ = branches
    parent = await run_job(pipeline, "parent", sampling_params={"keep_snapshots": 2})
    assert parent["state"] == "done", parent["error"]
    branch = await run_job(pipeline, "branch", branch=Branch(job_id="parent", turn=1))
    assert branch["state"] == "done", branch["error"]
    observation = branch["trajectory"]["messages"][-2]
    assert observation["role"] == "tool"
    assert f"{DIR}|x y|CLEAN" in observation["content"]
