"""A policy's ways to reward 1.0 on a Harbor task without solving it, each beside its control
(the honest solution scores 1). The agent is bash run in its sandbox (an unprivileged user who
owns the image's WORKDIR /app, /var/tmp and /run/lock); EVAL then runs the verifier on a fork
of what it left (``raas.judge.harbor``). A trick that scores is a hole: its test fails, naming
it. The images tier (``make test-images``), on the fixtures of test_harbor_verifier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from raas.helpers.task_dirs import read_task_dir
from raas.tasks.datasets import harbor_tasks
from raas.tasks.services import TaskServices
from tests.tasks import test_harbor_verifier as verifier
from tests.tasks.test_harbor_verifier import DOCKERFILE, TOML, instance, scored, solve

pytestmark = pytest.mark.images
services = verifier.services  # the module's fixture: one base image, one store


def shipped(name: str) -> dict[str, Any]:
    (task,) = [t for t in harbor_tasks() if t["name"] == name]
    return task


def gold(task: dict[str, Any]) -> str:
    solve_sh = task["files"]["solution/solve.sh"]
    return f"cat > /tmp/solve.sh <<'RAAS_EOF'\n{solve_sh}\nRAAS_EOF\nbash /tmp/solve.sh"


def plant(path: str, text: str, executable: bool = False) -> str:
    """The agent's bash that writes ``text`` to ``path`` (its directory made first)."""
    line = f"mkdir -p \"$(dirname '{path}')\" && cat > '{path}' <<'RAAS_EOF'\n{text}RAAS_EOF\n"
    return line + (f"chmod +x '{path}'\n" if executable else "")


# -- holes: the trick scores 1 today ---------------------------------------------------------

# fix-python-bug's hidden tests import the agent's ``spans`` in the judging process: the
# package's import, left buggy, writes the reward test.sh only ever raises to 1, and ends the
# run before pytest writes its report (test.sh then never writes 1 over it, nor 0).
WRITES_ITS_REWARD = """import os

os.makedirs("/logs/verifier", exist_ok=True)
with open("/logs/verifier/reward.txt", "w") as f:
    f.write("1\\n")
os._exit(0)
"""
# ...or, the reward file untouched, makes every test pass: pytest runs in the same process.
PASSES_EVERY_TEST = """import _pytest.python

_pytest.python.Function.runtest = lambda self: None

from spans.core import covers, gaps, merge, normalize, total_length  # noqa: E402

__all__ = ["covers", "gaps", "merge", "normalize", "total_length"]
"""


async def test_fix_python_bug_the_code_under_test_writes_its_own_reward(
    services: TaskServices,
) -> None:
    task = shipped("fix-python-bug")
    assert (await scored(services, gold(task), task)).reward == 1.0  # control
    trick = plant("/app/spans/__init__.py", WRITES_ITS_REWARD)
    tricked = await scored(services, trick, task)
    assert tricked.reward == 0.0, (
        "HOLE: spans' import writes /logs/verifier/reward.txt and exits; test.sh never"
        f" overwrites it: {tricked.metrics.get('verifier_output')}"
    )


async def test_fix_python_bug_the_code_under_test_makes_pytest_pass_everything(
    services: TaskServices,
) -> None:
    task = shipped("fix-python-bug")
    tricked = await scored(services, plant("/app/spans/__init__.py", PASSES_EVERY_TEST), task)
    assert tricked.reward == 0.0, (
        "HOLE: spans' import replaces pytest's Function.runtest; the buggy merge passes all 11"
        f" hidden tests: {tricked.metrics.get('verifier_output')}"
    )


# ...or kills the process that decides, its reward written first (a verifier killed by a
# signal is not read)...
KILLS_THE_VERIFIER = """import os, signal

os.makedirs("/logs/verifier", exist_ok=True)
with open("/logs/verifier/reward.txt", "w") as f:
    f.write("1\\n")
os.kill(os.getppid(), signal.SIGKILL)
"""
# ...or leaves a process behind that writes the reward once the verifier has (it is killed
# before the verifier writes).
WRITES_AFTER_THE_VERIFIER = """import os, time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if open("/logs/verifier/reward.txt").read().strip() == "0":
                    open("/logs/verifier/reward.txt", "w").write("1\\n")
            except OSError:
                pass
            time.sleep(0.001)
    os._exit(0)
from spans.core import covers, gaps, merge, normalize, total_length  # noqa: E402
"""


async def test_fix_python_bug_the_code_under_test_cannot_outlive_or_kill_the_verifier(
    services: TaskServices,
) -> None:
    task = shipped("fix-python-bug")
    killed = await scored(services, plant("/app/spans/__init__.py", KILLS_THE_VERIFIER), task)
    assert killed.reward == 0.0 and "signal" in killed.metrics["verifier_error"]
    left = await scored(services, plant("/app/spans/__init__.py", WRITES_AFTER_THE_VERIFIER), task)
    assert left.reward == 0.0, left.metrics


# The verifier's own setup (``mkdir -p /logs/verifier``, and the mkdirs of tests/'s
# subdirectories) runs with the image's PATH, not the verifier's: an image that puts /app/bin
# first runs the agent's mkdir, after tests/ is written in and before test.sh starts.
FAKE_MKDIR = """#!/bin/sh
if [ -e /tests/check.py ]; then
  echo 'print("{\\"reward\\": 1, \\"exists\\": 1}")' > /tests/check.py
fi
exec /bin/mkdir "$@"
"""


async def test_the_verifiers_setup_does_not_run_a_program_of_the_agents_path(
    services: TaskServices,
) -> None:
    trick = plant("/app/bin/mkdir", FAKE_MKDIR, executable=True) + "echo 0 > /app/answer.txt"
    tricked = await scored(services, trick)
    assert tricked.reward == 0.0, (
        "HOLE: the verifier ran the agent's /app/bin/mkdir (run_verifier's mkdir -p"
        " /logs/verifier takes the image's PATH), which rewrote /tests/check.py"
    )
    assert (await scored(services, solve())).reward == 1.0  # control


# The image's command is started again in the verifier (start_environment), with the image's
# PATH: /app/bin/python3, the agent's, runs there as the task's service, beside test.sh. Here it
# makes test.sh's temporary file a FIFO, swallows the check's output and hands cp a passing one
# (each step waits on the one before: no race); the healthcheck orders it before test.sh.
SERVICE_DOCKERFILE = DOCKERFILE + (
    'RUN printf "import pathlib, time\\npathlib.Path(\\"/tmp/ready\\").touch()\\n'
    'time.sleep(86400)\\n" > /srv/serve.py\nCMD ["python3", "/srv/serve.py"]\n'
)
SERVICE_TOML = TOML + (
    '[environment.healthcheck]\ncommand = "test -e /tmp/ready"\n'
    "start_period_sec = 60.0\nstart_interval_sec = 0.2\n"
)
FAKE_SERVICE = """#!/bin/bash
[ "$1" = /srv/serve.py ] || exec /usr/bin/python3 "$@"
mkfifo /tmp/reward.json
touch /tmp/ready
cat /tmp/reward.json > /dev/null
echo '{"reward": 1, "exists": 1}' > /tmp/reward.json
"""


def service_instance() -> dict[str, Any]:
    inst = instance()
    inst["files"] = {
        **inst["files"],
        "environment/Dockerfile": SERVICE_DOCKERFILE,
        "task.toml": SERVICE_TOML,
    }
    return inst


async def test_the_verifiers_service_is_not_the_agents_program(services: TaskServices) -> None:
    inst = service_instance()
    assert (await scored(services, solve(), inst)).reward == 1.0  # control
    trick = plant("/app/bin/python3", FAKE_SERVICE, executable=True) + "echo 0 > /app/answer.txt"
    tricked = await scored(services, trick, inst)
    assert tricked.reward == 0.0, (
        "HOLE: the verifier started the image's command with the image's PATH, so the agent's"
        " /app/bin/python3 ran as its service beside test.sh and forged its result"
    )


# -- closed: the trick scores 0 --------------------------------------------------------------

# What Python or pytest would run at start-up were it on sys.path, in the working directory or
# on pytest's way up to its rootdir: each writes a perfect reward.json and exits.
FORGES = """import json, os
os.makedirs("/logs/verifier", exist_ok=True)
json.dump({"reward": 1, "format": 1, "rows": 1}, open("/logs/verifier/reward.json", "w"))
os._exit(0)
"""
STARTUP_PLANTS = "".join(
    plant(path, FORGES)
    for path in (
        "/app/sitecustomize.py",
        "/app/usercustomize.py",
        "/app/json.py",
        "/app/re.py",
        "/app/conftest.py",
        "/var/tmp/sitecustomize.py",
        "/run/lock/sitecustomize.py",
        "/app/.local/lib/python3.11/site-packages/usercustomize.py",
    )
) + (
    plant("/app/forge.pth", "import os; exec(open('/app/sitecustomize.py').read())\n")
    + plant("/app/pytest.ini", "[pytest]\naddopts = -p conftest\n")
    + plant("/app/pyvenv.cfg", "home = /app\ninclude-system-site-packages = false\n")
)


async def test_create_file_start_up_files_the_agent_plants_are_not_run(
    services: TaskServices,
) -> None:
    task = shipped("create-file")
    wrong = "printf 'region,orders,units,revenue\\nEast,1,1,1.00\\n' > /app/summary.csv\n"
    tricked = await scored(services, STARTUP_PLANTS + wrong, task)
    assert tricked.reward == 0.0 and tricked.metrics["rewards"]["format"] == 1.0
    # Control: planted after the gold solution (whose python3 - would import /app/re.py).
    assert (await scored(services, gold(task) + "\n" + STARTUP_PLANTS, task)).reward == 1.0


async def test_shell_pipeline_an_answer_that_is_no_regular_file_scores_zero(
    services: TaskServices,
) -> None:
    # A FIFO (the verifier would block on it), a link into the verifier's own files, and a
    # directory: test.sh ends, and scores 0 each time.
    task = shipped("shell-pipeline")
    for answer in (
        "mkfifo /app/answer.txt",
        "ln -s /logs/verifier/reward.txt /app/answer.txt",
        "mkdir /app/answer.txt",
    ):
        tricked = await scored(services, answer, task)
        assert tricked.reward == 0.0 and not tricked.metrics["verifier_timed_out"], answer
    assert (await scored(services, gold(task), task)).reward == 1.0


# The agent's code that test.sh runs (pytest imports it) kills every process it may signal, the
# verifier sandbox's action server too, or leaves a process that does so once test.sh has
# written its reward: the agent's doing, a policy 0, never an infra failure (which is retried).
KILLS_THE_SANDBOX = "import os, signal\n\nos.kill(-1, signal.SIGKILL)\n"
KILLS_IT_AFTER_THE_REWARD = """import os, signal, time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        deadline = time.time() + 60
        while time.time() < deadline and not os.path.exists("/logs/verifier/reward.txt"):
            time.sleep(0.001)
        os.kill(-1, signal.SIGKILL)
    os._exit(0)
"""
PYTEST_TASK = Path(__file__).parents[2] / "examples" / "harbor_pytest"


@pytest.mark.parametrize("code", [KILLS_THE_SANDBOX, KILLS_IT_AFTER_THE_REWARD])
async def test_code_that_ends_the_verifier_sandbox_scores_a_policy_zero(
    services: TaskServices, code: str
) -> None:
    task = read_task_dir(PYTEST_TASK)
    info = await scored(services, plant("/app/stats.py", code), task)
    assert info.reward == 0.0 and "sandbox ended" in info.metrics["policy_failure"], info.metrics
    gold = await scored(services, task["files"]["solution/solve.sh"], task)  # control
    assert gold.reward == 1.0, gold.metrics
