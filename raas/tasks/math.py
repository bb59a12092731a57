"""``math``: answer a problem; the final answer is checked symbolically against the truth.

Instance: ``problem`` (or ``question``, or ``prompt`` as text or chat messages, as in verl's
format) and ``answer`` (or ``ground_truth``). The answer is the finish tool's ``answer`` or the
last ``\\boxed{}`` in the model's last message; math-verify decides equivalence (1/2 = 0.5 =
\\frac{1}{2}), not string matching. The agent may compute with ``ipython``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from raas.tasks.agentic import AgentContext, AgentTask, last_assistant_text
from raas.tasks.answers import check_math, final_answer
from raas.tasks.protocol import InvalidInstance, RewardInfo, TaskJob
from raas.tasks.services import TaskServices
from raas.wire import Trajectory


def ground_truth(instance: dict[str, Any]) -> str | None:
    for key in ("answer", "ground_truth"):
        if instance.get(key) not in (None, ""):
            return str(instance[key])
    return None


def question_messages(
    instance: dict[str, Any], system: str, keys: tuple[str, ...], suffix: str
) -> list[dict[str, Any]]:
    """The task as chat messages: verl-style ``prompt`` messages as they are, text otherwise."""
    prompt = instance.get("prompt")
    if isinstance(prompt, list):
        return [dict(m) for m in prompt]
    text = next(str(instance[k]) for k in keys if instance.get(k))
    return [{"role": "system", "content": system}, {"role": "user", "content": text + suffix}]


class MathTask(AgentTask):
    name = "math"
    tools = ("ipython", "finish", "think")
    default_max_turns = 6
    system_prompt = (
        "Solve the problem. You may compute with the ipython tool. Give the final answer by"
        " calling finish with it, or write it as \\boxed{...} at the end of your answer."
    )
    text_keys = ("problem", "question", "prompt")

    def validate(self, job: TaskJob) -> None:
        super().validate(job)
        if not any(job.instance.get(k) for k in self.text_keys):
            raise InvalidInstance("instance.problem", f"{self.name} needs the problem text")
        if ground_truth(job.instance) is None:
            raise InvalidInstance("instance.answer", f"{self.name} needs the ground-truth answer")

    def messages(self, instance: dict[str, Any]) -> list[dict[str, Any]]:
        return question_messages(instance, self.system_prompt, self.text_keys, "")

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        return {"answer": final_answer(last_assistant_text(trajectory), ctx.answer)}

    async def judge(
        self, instance: dict[str, Any], artifact: dict[str, Any], services: TaskServices
    ) -> RewardInfo:
        truth = ground_truth(instance) or ""
        answer = artifact.get("answer")
        # math-verify may take seconds on a hard expression: never on the event loop.
        correct = await asyncio.to_thread(check_math, answer, truth)
        return RewardInfo(1.0 if correct else 0.0, {"correct": correct, "ground_truth": truth})
