"""An example raas task: how many lines of a log file contain a given text?

INIT writes the instance's log into the job's sandbox as /workspace/app.log; RUN is raas's
agent loop with the built-in ``bash`` and ``finish`` tools and one tool of this task's own,
``count_lines``; EVAL compares the finish tool's answer with the true count (reward 1.0 or 0.0).

Installed (``pip install -e examples/my_task``), its entry point registers it under the
``raas.tasks`` group, so ``raas serve`` and ``raas run`` run ``{"data_source": "log_count",
"log": "...", "pattern": "ERROR"}`` with no change to raas.
"""

from __future__ import annotations

import shlex
from typing import Any

from raas.agent.tools import ToolOutcome
from raas.judge.reasons import with_reason, wrong_answer
from raas.sandbox import Sandbox
from raas.tasks.agentic import AgentContext, AgentTask
from raas.tasks.protocol import RewardInfo, TaskInstance, Text
from raas.tasks.services import TaskServices
from raas.wire import Trajectory

LOG = "/workspace/app.log"


class LogCountInstance(TaskInstance):
    """The fields a job's instance must hold: a submission without them, or with a number
    where text belongs, is answered 422 naming the field (``instance.pattern``)."""

    log: Text
    pattern: Text


class CountLines:
    """A tool of this task's own (raas.agent.tools.Tool): what the model is shown (name,
    description, JSON-schema parameters) and what a call does, here in the job's sandbox."""

    name = "count_lines"
    description = "Count the lines of a file that contain a text (plain text, not a pattern)."
    parameters = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
        "required": ["path", "text"],
    }

    async def __call__(self, args: dict[str, Any], sandbox: Sandbox | None) -> ToolOutcome:
        if sandbox is None:
            return ToolOutcome("Error: count_lines needs a sandbox")
        text, path = shlex.quote(str(args["text"])), shlex.quote(str(args["path"]))
        result = await sandbox.bash(f"grep -cF -- {text} {path}")
        # grep -c prints 0 and exits 1 when nothing matches; a missing file is exit code 2
        if result.exit_code > 1:
            return ToolOutcome(f"Error: {result.output.strip()}")
        return ToolOutcome(result.output.strip())


class LogCountTask(AgentTask):
    name = "log_count"
    instance_model = LogCountInstance
    tools = ("bash", CountLines(), "finish")
    default_max_turns = 4
    system_prompt = "You answer questions about log files. Use the tools, then call finish."

    def messages(self, instance: dict[str, Any]) -> list[dict[str, Any]]:
        question = f"How many lines of {LOG} contain {instance['pattern']!r}? Answer a number."
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": question},
        ]

    async def setup(self, ctx: AgentContext) -> None:
        assert ctx.sandbox is not None  # needs_sandbox is True (AgentTask's default)
        await ctx.sandbox.write_file(LOG, ctx.job.instance["log"])

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        # What EVAL judges, kept in the result's metrics (raas run --replay re-judges it).
        return {"answer": ctx.answer}

    async def judge(
        self, instance: dict[str, Any], artifact: dict[str, Any], services: TaskServices
    ) -> RewardInfo:
        truth = sum(instance["pattern"] in line for line in instance["log"].splitlines())
        answer = str(artifact.get("answer") or "").strip()
        reward = 1.0 if answer == str(truth) else 0.0
        why = wrong_answer(answer, truth)  # below a pass, metrics.reason: "answer read: 2, ..."
        return RewardInfo(reward, with_reason(reward, {"truth": truth}, why))
