"""mini-SWE-agent (``pip install mini-swe-agent``) as a harness task's agent program.

The harness task binds the agents environment's site-packages read-only into the sandbox, on
``PYTHONPATH`` (see raas.tasks.harness), and runs this file with the job's ``OPENAI_BASE_URL``
and ``OPENAI_API_KEY``. It runs mini-SWE-agent's own command line, unmodified, with its own
``mini.yaml`` config (one ``bash`` tool, every command in a fresh subshell, ``echo
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` to finish): unattended (``--yolo
--exit-immediately``), on litellm's ``openai/`` provider pointed at the gateway, with
litellm's packaged model cost map (it would fetch one from the internet otherwise) and cost
tracking off (the gateway's model has no price). The task is the job's user messages (in the
file ``$RAAS_MESSAGES_FILE``), the step limit ``$RAAS_MAX_TURNS``; the submission (what the
finishing command's output holds after its first line) goes to ``$RAAS_ANSWER_FILE``.
Arguments are passed on to ``mini`` (``-c agent.step_limit=5``, ``-c swebench.yaml``...).
Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any


def mini_command(task: str, trajectory: str, extra: list[str]) -> list[str]:
    return [
        sys.executable, "-s", "-m", "minisweagent.run.mini",
        "--yolo", "--exit-immediately",
        "--model", "openai/" + os.environ.get("RAAS_MODEL", "policy"),
        "--task", task,
        "--output", trajectory,
        "-c", "mini.yaml",
        "-c", "agent.cost_limit=0",
        "-c", "agent.step_limit=" + os.environ.get("RAAS_MAX_TURNS", "0"),
        "-c", "model.model_kwargs.api_base=" + os.environ["OPENAI_BASE_URL"],
        *extra,
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    extra = sys.argv[1:] if argv is None else argv
    with open(os.environ["RAAS_MESSAGES_FILE"], encoding="utf-8") as f:
        messages: list[dict[str, Any]] = json.load(f)
    # The problem itself: raas's system prompts describe raas's own tools, not mini's.
    task = "\n\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "user")
    home = tempfile.mkdtemp(prefix="mini-swe-agent-")
    trajectory = os.path.join(home, "trajectory.json")
    env = dict(
        os.environ,
        MSWEA_CONFIGURED="1",  # no first-run set-up dialogue
        MSWEA_SILENT_STARTUP="1",
        MSWEA_GLOBAL_CONFIG_DIR=home,  # its .env, in a directory of this run's
        MSWEA_COST_TRACKING="ignore_errors",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
    )
    done = subprocess.run(
        mini_command(task, trajectory, extra), env=env, stdin=subprocess.DEVNULL, check=False
    )
    try:
        with open(trajectory, encoding="utf-8") as f:
            info = json.load(f).get("info") or {}
    except (OSError, ValueError):
        info = {}
    print(f"mini-swe-agent: exit {done.returncode}, status {info.get('exit_status')!r}", flush=True)
    answer_file = os.environ.get("RAAS_ANSWER_FILE")
    if answer_file and info.get("submission"):
        with open(answer_file, "w", encoding="utf-8") as f:
            f.write(str(info["submission"]))
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
