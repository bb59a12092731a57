"""``math``: answer a problem; the final answer is checked symbolically against the truth.

Instance: ``problem`` (or ``question``, or ``prompt`` as text or chat messages, as in verl's
format) and ``answer`` (or verl's ``ground_truth``, or ``reward_model.ground_truth`` as in a verl
row as it is; a list of them means any one is right). Rows of verl's datasets run here under
their own ``data_source`` (``openai/gsm8k``, ``math_dapo``... see ``raas.tasks.sources``), which
also says where a reply puts its answer: GSM8K's ``#### 72``, DAPO's ``Answer: 72``, MATH's
``\\boxed{}``. The answer is the finish tool's ``answer``, else the one the model's last message
marks that way; math-verify decides equivalence (1/2 = 0.5 = \\frac{1}{2}), not string matching.
The agent may compute with ``ipython``.

``"scorer": "verl"`` in an instance scores it with verl's own reward function for its
data_source (``verl.utils.reward_score.default_compute_score``, verl's rewards as they are, -1.0
for a wrong DAPO answer included) where the ``verl`` package is installed; such an instance is
refused at submission where it is not. verl's scorers read a reply's text, so a finish tool's
answer reaches them written the way the dataset asks (``#### 72``, ``Answer: 72``, a box), and
only where it holds one value: verl's scorers keep one value of ``72 or 73``.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    PlainValidator,
    StrictStr,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from raas.agent.tools import Tool
from raas.judge.answers import (
    MARKERS,
    AnswerMarker,
    final_answer,
    holds_one_value,
    judge_math,
    marked_answer,
)
from raas.judge.reasons import one_of, with_reason
from raas.tasks import sources
from raas.tasks.agentic import AgentContext, AgentTask, last_assistant_text
from raas.tasks.protocol import PolicyError, RewardInfo, TaskInstance, located_error
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


def _truth(value: Any) -> str | int | float | list[str | int | float]:
    if isinstance(value, list):
        if not value:
            raise PydanticCustomError("truth_type", "Input should not be an empty list")
        return [_scalar(v) for v in value]
    return _scalar(value)


# The JSON schemas of what the plain validators take (a PlainValidator's own is any value).
SCALAR_SCHEMA = {"anyOf": [{"type": "string"}, {"type": "number"}]}
_TRUTH_SCHEMA = {
    "anyOf": [*SCALAR_SCHEMA["anyOf"], {"type": "array", "items": SCALAR_SCHEMA, "minItems": 1}]
}
_MESSAGES_SCHEMA = {
    "type": "array",
    "items": {"type": "object", "required": ["role"], "properties": {"role": {"type": "string"}}},
}
# An answer as datasets write it: "0.75", 3, 2.5 (what math-verify and float() compare).
Scalar = Annotated[str | int | float, PlainValidator(_scalar), WithJsonSchema(SCALAR_SCHEMA)]
# verl's ground truth: one answer, or a list of answers any of which is right (DeepScaleR's rows).
Truth = Annotated[
    str | int | float | list[str | int | float],
    PlainValidator(_truth),
    WithJsonSchema(_TRUTH_SCHEMA),
]
TextOrMessages = Annotated[
    str | list[dict[str, Any]],
    PlainValidator(_text_or_messages),
    WithJsonSchema({"anyOf": [{"type": "string"}, _MESSAGES_SCHEMA]}),
]
Scorer = Literal["raas", "verl"]


class VerlRewardModel(BaseModel):
    """verl's ``reward_model`` column: ``{"style": "rule", "ground_truth": ...}``."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, frozen=True)

    ground_truth: Truth
    style: StrictStr | None = None


def _a_problem_and_a_truth(schema: dict[str, Any]) -> None:
    """What _has_problem_and_answer checks, in the instance's JSON schema."""
    given = {"not": {"anyOf": [{"type": "null"}, {"const": ""}, {"const": []}]}}
    problems = [
        {"required": [name], "properties": {name: given}}
        for name in ("problem", "question", "prompt")
    ]
    truths: list[dict[str, Any]] = [
        {"required": [name], "properties": {name: given}} for name in ("answer", "ground_truth")
    ]
    truths.append(
        {
            "required": ["reward_model"],
            "properties": {
                "reward_model": {"type": "object", "properties": {"ground_truth": given}}
            },
        }
    )
    schema["allOf"] = [{"anyOf": problems}, {"anyOf": truths}]
    if not verl_installed():  # the scorers this server has
        schema["properties"]["scorer"] = {**schema["properties"]["scorer"], "enum": ["raas"]}


class MathInstance(TaskInstance):
    """The problem under one of three names, the truth under one of three (raas's and verl's)."""

    model_config = ConfigDict(json_schema_extra=_a_problem_and_a_truth)

    problem: StrictStr | None = None
    question: StrictStr | None = None
    prompt: TextOrMessages | None = None
    answer: Scalar | None = None
    ground_truth: Truth | None = None
    reward_model: VerlRewardModel | None = None
    scorer: Scorer = "raas"

    @model_validator(mode="after")
    def _has_problem_and_answer(self) -> Self:
        if not (self.problem or self.question or self.prompt):
            raise located_error(
                ("problem",), "math needs the problem text (problem, question or prompt)"
            )
        truth = self.reward_model.ground_truth if self.reward_model is not None else None
        if all(v in (None, "") for v in (self.answer, self.ground_truth, truth)):
            raise located_error(
                ("answer",),
                "math needs the ground-truth answer (answer, ground_truth or"
                " reward_model.ground_truth)",
            )
        if self.scorer == "verl" and not verl_installed():
            raise located_error(
                ("scorer",),
                "the verl package is not installed on this server, so verl's scorer cannot be"
                " used; leave scorer out (or 'raas') for raas's own",
                self.scorer,
            )
        return self


def verl_installed() -> bool:
    return importlib.util.find_spec("verl") is not None


def raw_truth(instance: dict[str, Any]) -> Any:
    """The ground truth as the instance gives it: ``answer``, ``ground_truth``, or verl's
    ``reward_model.ground_truth`` (one value or a list)."""
    reward_model = instance.get("reward_model")
    nested = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    for value in (instance.get("answer"), instance.get("ground_truth"), nested):
        if value not in (None, "", []):
            return value
    return None


def ground_truths(instance: dict[str, Any]) -> list[str]:
    """Every right answer (a list of ground truths means any one of them), as text."""
    value = raw_truth(instance)
    values = value if isinstance(value, list) else [] if value is None else [value]
    return [str(v) for v in values if str(v).strip()]


class QuestionTask(AgentTask):
    """A question answered in a few turns, computing with ipython (math, stem): its text is
    under the first of ``text_keys`` that the instance has, or verl-style ``prompt`` messages."""

    tools: ClassVar[tuple[str | Tool, ...]] = ("ipython", "finish", "think")
    default_max_turns = 6
    text_keys: ClassVar[tuple[str, ...]] = ("question",)

    def after_text(self, instance: dict[str, Any]) -> str:
        """What the user message adds after the question's text (a subclass's choices, say)."""
        return ""

    def messages(self, instance: dict[str, Any]) -> list[dict[str, Any]]:
        prompt = instance.get("prompt")
        if isinstance(prompt, list) and prompt:  # an empty list: the text under another key
            return [dict(m) for m in prompt]
        text = next(str(instance[k]) for k in self.text_keys if instance.get(k))
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": text + self.after_text(instance)},
        ]


class MathTask(QuestionTask):
    name = "math"
    instance_model = MathInstance
    system_prompt = (
        "Solve the problem. You may compute with the ipython tool. Give the final answer by"
        " calling finish with it, or write it as \\boxed{...} at the end of your answer."
    )
    text_keys = ("problem", "question", "prompt")

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        instance = ctx.job.instance
        markers = sources.markers(str(instance.get("data_source", "")))
        text = last_assistant_text(trajectory)
        # The finish tool's answer is the answer; a marker around it (any kind) is taken off.
        every = (*markers, *(m for m in MARKERS if m not in markers))
        artifact: dict[str, Any] = {
            "answer": final_answer(None, ctx.answer, every) or final_answer(text, None, markers)
        }
        if instance.get("scorer") == "verl":
            # math-verify reads the finish answer: off the event loop.
            artifact["solution"] = await asyncio.to_thread(
                verl_solution, text, ctx.answer, markers, ground_truths(instance)
            )
        return artifact

    async def judge(
        self, instance: dict[str, Any], artifact: dict[str, Any], services: TaskServices
    ) -> RewardInfo:
        if instance.get("scorer") == "verl":
            return await asyncio.to_thread(verl_judge, instance, artifact)
        truths = ground_truths(instance)
        answer = artifact.get("answer")
        # math-verify may take seconds on a hard expression: never on the event loop.
        verdict = await asyncio.to_thread(judge_math, answer, truths)
        truth: str | list[str] = truths[0] if len(truths) == 1 else truths
        metrics: dict[str, Any] = {
            "correct": verdict.correct,
            "ground_truth": truth,
            "read": verdict.read,
        }
        reward = 1.0 if verdict.correct else 0.0
        return RewardInfo(reward, with_reason(reward, metrics, verdict.reason(truths) or ""))


# ---------------------------------------------------------------------------------------------
# verl's own scorer (``"scorer": "verl"``), where the verl package is installed

SOLUTION_CHARS = 4000
"""How much of the reply's end verl's scorer gets (and the artifact keeps)."""

_WRITTEN: dict[AnswerMarker, str] = {
    "gsm8k": "#### {}",
    "answer_line": "Answer: {}",
    "boxed": "\\boxed{{{}}}",
    "answer_is": "\\boxed{{{}}}",
}


def verl_solution(
    text: str,
    finish_answer: str | None,
    markers: tuple[AnswerMarker, ...],
    truths: Sequence[str] = (),
) -> str:
    """The reply as verl's scorer reads it: the last message's text, and the finish tool's answer
    (if any) on a line of its own, written the way the dataset asks (a mark around it taken off
    first). A finish answer that holds more than one value (``72 or 73``, ``7,2``, two marks) is
    no answer, and verl is given nothing to read: its scorers would keep one of the values."""
    if finish_answer is None or not finish_answer.strip():
        return text[-SOLUTION_CHARS:]
    every = (*markers, *(m for m in MARKERS if m not in markers))
    answer = final_answer(None, finish_answer, every)
    # A mark still in it: it was not all the answer held (final_answer leaves those whole).
    if marked_answer(answer or "", every) is not None or not holds_one_value(answer, truths):
        return ""
    line = _WRITTEN[markers[0]].format(answer)
    solution = f"{text}\n{line}" if text.strip() else line
    return solution[-SOLUTION_CHARS:]


def verl_judge(instance: dict[str, Any], artifact: dict[str, Any]) -> RewardInfo:
    """verl's reward for the reply: ``default_compute_score(data_source, reply, truth, extra)``."""
    reward_score = importlib.import_module("verl.utils.reward_score")
    data_source = str(instance.get("data_source", ""))
    truth = raw_truth(instance)
    solution = str(artifact.get("solution") or "")
    try:
        score = reward_score.default_compute_score(
            data_source, solution, truth, instance.get("extra_info") or {}
        )
    except NotImplementedError as e:
        raise PolicyError(f"verl has no scorer for data_source {data_source!r}: {e}") from e
    details = score if isinstance(score, dict) else {"score": score}
    reward = float(details["score"])
    metrics: dict[str, Any] = {
        "scorer": "verl",
        "correct": bool(details.get("acc", reward > 0)),
        "ground_truth": truth,
    }
    metrics["verl"] = {
        k: v for k, v in details.items() if isinstance(v, str | int | float | bool) or v is None
    }
    # verl's scorers say what they read only where they do (DAPO's ``pred``).
    read = f", answer read: {details['pred']}" if details.get("pred") is not None else ""
    expected = one_of(ground_truths(instance))
    why = f"verl's {data_source} scorer gave {reward:g}{read}, expected {expected}"
    return RewardInfo(reward, with_reason(reward, metrics, why))
