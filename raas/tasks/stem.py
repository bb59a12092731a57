"""``stem``: multiple-choice (a letter) or numeric (within a relative tolerance) questions.

Instance: ``question``; for multiple choice ``choices`` ({"A": ..., ...}) and ``answer`` (the
letter); for numeric ``answer`` (a number), optionally ``unit`` and ``rel_tol`` (default 1%).
The answer is the finish tool's, else the one the last message marks (``\\boxed{}``), else that
message's end; ``finish_only: true`` scores the finish tool's answer alone, so that a reply in
plain text scores 0 (the tool call is what is rewarded).
"""

from __future__ import annotations

import math
from typing import Any, Self

from pydantic import ConfigDict, Field, StrictBool, StrictFloat, StrictStr, model_validator

from raas.judge.answers import (
    check_choice,
    check_numeric,
    final_answer,
    numeric_reason,
    parse_choice,
    parse_numbers,
)
from raas.judge.reasons import with_reason, wrong_answer
from raas.tasks.agentic import AgentContext, last_assistant_text
from raas.tasks.math import QuestionTask, Scalar
from raas.tasks.protocol import RewardInfo, TaskInstance, Text, located_error
from raas.tasks.services import TaskServices
from raas.wire import Trajectory

# A number's text that float() reads as a finite number (at most 200 digits before the point and
# an exponent of two digits, so never past 1e308; float() takes more spellings than this).
NUMBER_TEXT = r"^[+-]?(?:[0-9]{1,200}(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,2})?$"
FINITE = {"type": "number", "minimum": -1e308, "maximum": 1e308}
CHOICE_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _answer_fits(schema: dict[str, Any]) -> None:
    """What _answer_fits_the_question checks, in the instance's JSON schema: a number (or a
    number's text) without choices, or one of the choices' letters. A choice named other than
    by a capital letter is taken too, which JSON Schema cannot tie to the answer."""
    number = {
        "required": ["answer"],
        "properties": {
            "choices": {"type": "null"},
            "answer": {"anyOf": [FINITE, {"type": "string", "pattern": NUMBER_TEXT}]},
        },
    }
    letters = [
        {
            "required": ["answer", "choices"],
            "properties": {
                "answer": {"const": letter},
                "choices": {"type": "object", "required": [letter]},
            },
        }
        for letter in CHOICE_LETTERS
    ]
    schema["anyOf"] = [number, *letters]


class StemInstance(TaskInstance):
    model_config = ConfigDict(json_schema_extra=_answer_fits)

    question: Text
    answer: Scalar
    choices: dict[str, Scalar] | None = None
    unit: StrictStr | None = None
    rel_tol: StrictFloat = Field(default=0.01, ge=0.0)
    finish_only: StrictBool = False

    @model_validator(mode="after")
    def _answer_fits_the_question(self) -> Self:
        if self.answer == "":
            raise located_error(("answer",), "stem needs the answer")
        if self.choices is not None:
            if str(self.answer) not in self.choices:
                letters = ", ".join(sorted(self.choices))
                raise located_error(
                    ("answer",), f"must be one of the choices' letters ({letters})", self.answer
                )
        elif not _is_number(self.answer):
            raise located_error(
                ("answer",), "must be a number (the question has no choices)", self.answer
            )
        return self


def _is_number(value: str | int | float) -> bool:
    try:
        return math.isfinite(float(value))
    except (ValueError, OverflowError):  # OverflowError: float() of an int beyond 1e308
        return False


class StemTask(QuestionTask):
    name = "stem"
    instance_model = StemInstance
    system_prompt = (
        "Answer the science question. You may compute with the ipython tool. Give the final"
        " answer (the letter of the choice, or the number) by calling finish, or as \\boxed{...}."
    )

    def after_text(self, instance: dict[str, Any]) -> str:
        if isinstance(instance.get("choices"), dict):
            return "\n" + "\n".join(f"{k}) {v}" for k, v in sorted(instance["choices"].items()))
        return f"\n(Answer in {instance['unit']}.)" if instance.get("unit") else ""

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        if ctx.job.instance.get("finish_only"):
            return {"answer": final_answer(None, ctx.answer), "given": True}
        text = last_assistant_text(trajectory)
        given = final_answer(text, ctx.answer)
        # "given": the finish tool's answer or a box, where one value is expected (a hedge such
        # as "3.1 or 3.2" is wrong); else the reply's end, read by its last number.
        return {"answer": given or text[-200:] or None, "given": given is not None}

    async def judge(
        self, instance: dict[str, Any], artifact: dict[str, Any], services: TaskServices
    ) -> RewardInfo:
        answer = artifact.get("answer")
        read: str | list[float] | None
        if isinstance(instance.get("choices"), dict):
            n_choices = len(instance["choices"])
            correct = check_choice(answer, str(instance["answer"]), n_choices)
            read = parse_choice(answer, n_choices)  # None: no letter, or more than one
            why = wrong_answer(read, instance["answer"])
            if read is None and answer:
                why = "no single choice letter found in the answer"
        else:
            one_value = bool(artifact.get("given"))
            rel_tol = float(instance.get("rel_tol", 0.01))
            truth = float(instance["answer"])
            correct = check_numeric(answer, truth, rel_tol=rel_tol, one_value=one_value)
            read = parse_numbers(answer) if one_value else parse_numbers(answer)[-1:]
            why = numeric_reason(answer, truth, rel_tol=rel_tol, one_value=one_value)
        reward = 1.0 if correct else 0.0
        return RewardInfo(reward, with_reason(reward, {"correct": correct, "read": read}, why))
