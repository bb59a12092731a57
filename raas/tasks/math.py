"""``math``: answer a problem; the final answer is checked symbolically against the truth.

Instance: ``problem`` (or ``question``, or ``prompt`` as text or chat messages, as in verl's
format) and ``answer`` (or ``ground_truth``). The answer is the finish tool's ``answer`` or the
last ``\\boxed{}`` in the model's last message; math-verify decides equivalence (1/2 = 0.5 =
\\frac{1}{2}), not string matching. The agent may compute with ``ipython``.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Self

from pydantic import PlainValidator, StrictStr, model_validator
from pydantic_core import PydanticCustomError

from raas.tasks.agentic import AgentContext, AgentTask, last_assistant_text
from raas.tasks.answers import check_math, final_answer
from raas.tasks.protocol import RewardInfo, TaskInstance, located_error
from raas.tasks.services import TaskServices
from raas.wire import Trajectory


def _scalar(value: Any) -> str | int | float:
    # One check, not a union of types: a union's errors would be located per member type.
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise PydanticCustomError("scalar_type", "Input should be a string or a number")
    return value


def _text_or_messages(value: Any) -> str | list[dict[str, Any]]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) for m in value
    ):
        return value
    raise PydanticCustomError(
        "text_or_messages", "Input should be text or chat messages (objects with a role)"
    )


# An answer as datasets write it: "0.75", 3, 2.5 (what math-verify and float() compare).
Scalar = Annotated[str | int | float, PlainValidator(_scalar)]
TextOrMessages = Annotated[str | list[dict[str, Any]], PlainValidator(_text_or_messages)]


class MathInstance(TaskInstance):
    """The problem under one of three names, the truth under one of two (raas's and verl's)."""

    problem: StrictStr | None = None
    question: StrictStr | None = None
    prompt: TextOrMessages | None = None
    answer: Scalar | None = None
    ground_truth: Scalar | None = None

    @model_validator(mode="after")
    def _has_problem_and_answer(self) -> Self:
        if not (self.problem or self.question or self.prompt):
            raise located_error(
                ("problem",), "math needs the problem text (problem, question or prompt)"
            )
        if all(v in (None, "") for v in (self.answer, self.ground_truth)):
            raise located_error(
                ("answer",), "math needs the ground-truth answer (answer or ground_truth)"
            )
        return self


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
    if isinstance(prompt, list) and prompt:  # an empty list: the text under another key
        return [dict(m) for m in prompt]
    text = next(str(instance[k]) for k in keys if instance.get(k))
    return [{"role": "system", "content": system}, {"role": "user", "content": text + suffix}]


class MathTask(AgentTask):
    name = "math"
    instance_model = MathInstance
    tools = ("ipython", "finish", "think")
    default_max_turns = 6
    system_prompt = (
        "Solve the problem. You may compute with the ipython tool. Give the final answer by"
        " calling finish with it, or write it as \\boxed{...} at the end of your answer."
    )
    text_keys = ("problem", "question", "prompt")

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
