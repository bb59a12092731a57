"""A Harbor task's verifier, run where nothing of the agent runs or lies in wait.

Harbor's own runner runs ``tests/test.sh`` in the agent's live container: whatever the agent
left running (a daemon that rewrites results), planted (``/logs/verifier/reward.txt``) or
replaced (``pytest`` or ``python3`` on the image's path) is there when the verifier runs. Here
the verifier gets a fork of the agent's sandbox that carries only the agent's files
(``ForkCarry``; of what was bound in, the server's own binds only, never a harness agent
program's: ``verifier_carry``), then the agent's sandbox is closed:

- no process, shell state, workspace or ``/tmp`` of the agent: a fresh action server, and
  ``test.sh`` a fresh process with the task's verifier env and timeout;
- the image's own ``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc``, ``/opt`` (``SYSTEM``):
  the agent's changes there are dropped, so the programs the verifier runs, their libraries
  and their configuration (``ld.so.preload``, ``sitecustomize``) are the image's; so are the
  changes to the root's top-level entries that are not directories (a ``/pytest.ini`` or
  ``/conftest.py`` planted where pytest would look);
- ``/tests`` and ``/logs`` empty tmpfs mounts of the verifier's own, over whatever the agent
  left there; ``tests/`` is written in only now (the agent never had it), and the reward is
  read from ``/logs/verifier`` of this sandbox;
- a verifier sandbox ended by what ``test.sh`` ran (the agent's code kills the action server,
  there or from a process it left) is a policy 0 (``policy_failure``), never an infra retry;
- ``PATH`` the image's, less every directory outside ``SYSTEM`` (an image that puts
  ``/app/bin`` first would run the agent's ``python3``); Python's user site and the current
  directory left off ``sys.path`` (``PYTHONNOUSERSITE``, ``PYTHONSAFEPATH``). The task's
  verifier env, which its author wrote, may set any of them otherwise.

What the agent changed under every other directory (``/app``, ``/root``, ``/srv``...) is what
the verifier judges. A verifier that runs code from there (a project's own ``conftest.py``,
``make``, git hooks of a repository the agent had) runs what the agent wrote: Harbor's task
authors judge the tree by reading it, and the docs say so (docs/harbor.md). Where the verifier
runs Python tests (``pytest`` on ``tests/test_*.py``, which import the agent's code in the
process whose exit status is the reward), that code can decide its own reward: it is run again
against twins of those tests (``raas.judge.harbor_twins``), each run a fresh fork of the
agent's files, and passing a twin scores 0 with ``tamper``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from raas.judge.programs import CandidateEnded, run_candidate
from raas.judge.reasons import REASON, clip, with_reason
from raas.sandbox import ForkCarry, Sandbox, SandboxError, ToolError

SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt")
TESTS_DIR = "/tests"
LOGS_DIR = "/logs"
VERIFIER_DIR = "/logs/verifier"
VERIFIER_CARRY = ForkCarry(
    image_kept=(*SYSTEM, "tests", "logs", "solution"),
    scratch=False,
    tmpfs_dirs=(TESTS_DIR, LOGS_DIR),
)
PYTHON_GUARDS = {"PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1", "PYTHONDONTWRITEBYTECODE": "1"}
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
REWARD_BYTES = 64 * 1024
OUTPUT_TAIL = 4000


def verifier_carry(binds: Mapping[str, str]) -> ForkCarry:
    """``VERIFIER_CARRY`` whose fork gets ``binds`` (the server's read-only binds) and no
    other: the agent's sandbox may have more (a harness agent's program, its packages, the
    user's agent files), which the verifier has no use for and is not given."""
    return dataclasses.replace(VERIFIER_CARRY, ro_binds=tuple(sorted(binds.items())))


@dataclass(frozen=True)
class VerifierRun:
    """What the verifier runs: ``tests`` (path below ``/tests`` -> bytes, executable), the
    task's verifier ``env``, its ``timeout_s``, the image's ``workdir`` (test.sh's directory),
    ``reward_key`` (the scalar of a reward.json), and the image's ``path`` (its PATH)."""

    tests: dict[str, tuple[bytes, bool]]
    env: dict[str, str] = field(default_factory=dict)
    path: str = DEFAULT_PATH
    timeout_s: float = 600.0
    workdir: str = "/"
    reward_key: str = "reward"


def system_path(path: str) -> str:
    """``path`` with only its directories under ``SYSTEM`` (whose agent's changes the
    verifier's fork drops), else ``DEFAULT_PATH``."""
    kept = [
        entry
        for entry in path.split(":")
        if entry.startswith("/") and ".." not in entry.split("/") and entry.split("/")[1] in SYSTEM
    ]
    return ":".join(kept) or DEFAULT_PATH


@dataclass
class HarborVerdict:
    """The scalar ``reward``, every named reward of a reward.json (``rewards``), and what the
    run said (``metrics``: exit status, timed out, the output's tail, an error)."""

    reward: float
    rewards: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


class RewardFileError(ValueError):
    pass


async def write_tree(
    sandbox: Sandbox,
    root: str,
    files: dict[str, tuple[bytes, bool]],
    env: dict[str, str] | None = None,
) -> None:
    """``files`` (relative path -> bytes, executable) written under ``root`` in ``sandbox``;
    ``env``: the environment of the ``mkdir`` it runs (a verifier's: its PATH)."""
    for rel, (data, executable) in sorted(files.items()):
        path = posixpath.join(root, rel)
        parent = posixpath.dirname(path)
        if parent != root:
            made = await sandbox.exec(["mkdir", "-p", "--", parent], env=env)
            if made.exit_code != 0:
                raise SandboxError(f"cannot make {parent}: {made.stderr.strip()[-300:]}")
        await sandbox.write_file(path, data, 0o755 if executable else 0o644)


async def run_verifier(verifier: Sandbox, run: VerifierRun) -> HarborVerdict:
    """``tests/test.sh`` in ``verifier`` (a fork with ``VERIFIER_CARRY``), and its reward.
    Every program it runs there, its own ``mkdir`` too, is found on the verifier's PATH: the
    image's would run the agent's ``mkdir`` from ``/app/bin``."""
    env = {"PATH": system_path(run.path), **PYTHON_GUARDS, **run.env}
    setup = {"PATH": system_path(run.path)}
    await write_tree(verifier, TESTS_DIR, run.tests, setup)
    made = await verifier.exec(["mkdir", "-p", "--", VERIFIER_DIR], env=setup)
    if made.exit_code != 0:
        raise SandboxError(f"cannot make {VERIFIER_DIR}: {made.stderr.strip()[-300:]}")
    try:
        # test.sh runs what the agent wrote (pytest imports it): a sandbox that ends under it
        # or before its reward is read is the agent's doing, a 0, never an infra retry.
        result = await run_candidate(
            verifier,
            ["bash", f"{TESTS_DIR}/test.sh"],
            cwd=run.workdir,
            env=env,
            timeout_s=run.timeout_s,
        )
        ended_well = not result.timed_out and result.exit_code >= 0
        rewards = await _rewards_of(verifier, run.reward_key) if ended_well else None
    except CandidateEnded as e:
        return _no_reward({"policy_failure": str(e)}, str(e))
    metrics: dict[str, Any] = {
        "verifier_exit_code": result.exit_code,
        "verifier_timed_out": result.timed_out,
        "verifier_output": (result.stdout + result.stderr)[-OUTPUT_TAIL:],
    }
    if result.timed_out:
        return _no_reward(metrics, f"test.sh ran past its {run.timeout_s:g} s")
    if result.exit_code < 0:
        # Killed by a signal, as code it ran (the agent's, under test) can do: what it left in
        # /logs is not the verifier's word.
        return _no_reward(metrics, f"test.sh was killed by signal {-result.exit_code}")
    if not isinstance(rewards, dict):
        return _no_reward(metrics, str(rewards))
    reward = rewards[run.reward_key]
    # test.sh's own last words (pytest's summary line, often) say why it scored so.
    last = next(
        (line for line in reversed(metrics["verifier_output"].splitlines()) if line.strip()), ""
    )
    why = f"test.sh scored {reward:g}" + (f": {last.strip()}" if last else " and printed nothing")
    return HarborVerdict(reward, rewards, with_reason(reward, metrics, why))


def _no_reward(metrics: dict[str, Any], error: str) -> HarborVerdict:
    """A 0 with no reward read: ``error`` is the verifier's error and the reason."""
    return HarborVerdict(0.0, {}, {**metrics, "verifier_error": error, REASON: clip(error)})


async def _rewards_of(verifier: Sandbox, key: str) -> dict[str, float] | RewardFileError:
    """``read_rewards``, its RewardFileError returned; a sandbox that ended after test.sh did
    (what test.sh left running killed it) is CandidateEnded."""
    try:
        return await read_rewards(verifier, key)
    except RewardFileError as e:
        return e
    except SandboxError as e:
        raise CandidateEnded(f"the sandbox ended before test.sh's reward was read: {e}") from e


async def read_rewards(verifier: Sandbox, key: str) -> dict[str, float]:
    """The rewards test.sh wrote: reward.json's named numbers, else reward.txt's one number
    (named ``key``). Neither, or a file that is not one of them, is a RewardFileError."""
    found = {}
    for name in ("reward.json", "reward.txt"):
        try:
            found[name] = await verifier.read_file(f"{VERIFIER_DIR}/{name}", max_bytes=REWARD_BYTES)
        except ToolError:
            continue
    if "reward.json" in found:
        return parse_reward_json(found["reward.json"], key)
    if "reward.txt" in found:
        return {key: parse_reward_text(found["reward.txt"])}
    raise RewardFileError(f"test.sh wrote neither {VERIFIER_DIR}/reward.txt nor reward.json")


def parse_reward_text(data: bytes) -> float:
    """reward.txt: one finite number."""
    try:
        value = float(data.decode("utf-8").strip())
    except (UnicodeDecodeError, ValueError):
        raise RewardFileError(f"reward.txt holds {data[:80]!r}, not a number") from None
    if not math.isfinite(value):
        raise RewardFileError(f"reward.txt holds {value}, not a finite number")
    return value


def parse_reward_json(data: bytes, key: str) -> dict[str, float]:
    """reward.json: an object of named finite numbers (booleans as 0 and 1), ``key`` among
    them."""
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RewardFileError("reward.json is not JSON") from None
    if not isinstance(parsed, dict):
        raise RewardFileError("reward.json is not an object of named rewards")
    rewards: dict[str, float] = {}
    for name, value in parsed.items():
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise RewardFileError(f"reward.json: {name!r} is {value!r}, not a finite number")
        rewards[str(name)] = float(value)
    if key not in rewards:
        raise RewardFileError(f"reward.json has no {key!r} (it has {', '.join(rewards) or 'none'})")
    return rewards
