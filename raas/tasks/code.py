"""``code``: write a function (HumanEval format); hidden tests decide.

Instance: ``prompt`` (signature and docstring), ``entry_point`` (the function's name), ``test``
(HumanEval's ``def check(candidate): ...``). The agent works on /workspace/solution.py, which
starts as the prompt; EVAL copies that file into a fresh sandbox and runs the hidden tests there
with a time limit: reward 1.0 if they all pass, else 0.0 with the failing output in the metrics.
"""

from __future__ import annotations

from typing import Any

from raas.sandbox import SandboxError, ToolError
from raas.tasks.agentic import AgentContext, AgentTask, fresh_sandbox
from raas.tasks.protocol import RewardInfo, TaskInstance, Text
from raas.tasks.services import TaskServices
from raas.wire import Trajectory

SOLUTION = "/workspace/solution.py"
TEST_TIMEOUT_S = 30.0


class CodeInstance(TaskInstance):
    prompt: Text
    entry_point: Text
    test: Text


class CodeTask(AgentTask):
    name = "code"
    instance_model = CodeInstance
    tools = ("bash", "editor", "finish", "think")
    system_prompt = (
        "You are an expert Python programmer working in a Linux sandbox. Implement the function"
        f" in {SOLUTION} (keep its name and signature). You can run Python with bash to try it."
        " When the implementation is complete, call finish."
    )

    def messages(self, instance: dict[str, Any]) -> list[dict[str, Any]]:
        task = f"Complete this function in {SOLUTION}:\n\n```python\n{instance['prompt']}```"
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": task},
        ]

    async def setup(self, ctx: AgentContext) -> None:
        assert ctx.sandbox is not None
        await ctx.sandbox.write_file(SOLUTION, str(ctx.job.instance["prompt"]))

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        if ctx.sandbox is None:
            return {"solution": None}
        try:
            code = (await ctx.sandbox.read_file(SOLUTION)).decode(errors="replace")
        except (ToolError, SandboxError):
            code = None
        return {"solution": code}

    async def judge(
        self, instance: dict[str, Any], artifact: dict[str, Any], services: TaskServices
    ) -> RewardInfo:
        code = artifact.get("solution")
        if not code:
            return RewardInfo(0.0, {"passed": False, "error": "no solution file"})
        harness = (
            f"{code}\n\n\n{instance['test']}\n\n\ncheck({instance['entry_point']})\n"
            "print('ALL TESTS PASSED')\n"
        )
        async with fresh_sandbox(services) as sandbox:
            await sandbox.write_file("/workspace/check.py", harness)
            result = await sandbox.bash("python3 /workspace/check.py", timeout_s=TEST_TIMEOUT_S)
        passed = result.exit_code == 0 and "ALL TESTS PASSED" in result.output
        metrics: dict[str, Any] = {"passed": passed, "timed_out": result.timed_out}
        if not passed:
            metrics["test_output"] = result.output[-2000:]
        return RewardInfo(1.0 if passed else 0.0, metrics)
