"""``lookup``: a question whose facts lie in files of the sandbox, never in the prompt.

Instance: ``question`` (or verl-style ``prompt`` messages), ``files`` ({relative path: text},
written into the sandbox's working directory before the first turn), ``answer``, matched by its
type in the data: an integer exactly, as an integer (never through a float, so a 20-digit id with
other last digits is wrong); a float (a measured quantity, ``3.5``) within ``rel_tol`` (default 0:
equal), the only kind of answer a tolerance applies to; a text exactly, once trimmed, so that an
id or a code is its characters: ``"0042"`` is not ``42``, nor ``"3.50"`` ``3.5``.

The model gets ``bash`` and ``finish``: it reads the files with a command, and the observation
determines its answer, given by calling finish. The finish tool's answer alone is judged, one
value (a hedge such as ``34 or 35`` scores 0), so a reply in plain text scores 0. A task that
can be answered from its prompt teaches nothing of the sandbox: the result's metrics say
``answer_in_prompt`` where the answer stands in the prompt as a whole word (a worked example's
answer equal to the question's, say), so that a dataset's author finds such rows.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Self

from pydantic import AfterValidator, ConfigDict, Field, StrictFloat, StrictStr, model_validator

from raas.agent.tools import Tool
from raas.judge.answers import check_numeric, exact_number, final_answer
from raas.judge.reasons import with_reason, wrong_answer
from raas.tasks.agentic import AgentContext
from raas.tasks.math import QuestionTask, Scalar
from raas.tasks.protocol import RewardInfo, TaskInstance, located_error
from raas.tasks.services import TaskServices
from raas.tasks.stem import FINITE
from raas.wire import Trajectory

MAX_FILES = 64
MAX_FILE_CHARS = 65536
# A file's path: relative, '/'-separated names of letters, digits, '.', '_' and '-' that do not
# start with '.' (so never '..'): a pattern the OpenAPI document carries too.
SEGMENT = r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}"
PATH_PATTERN = rf"^{SEGMENT}(/{SEGMENT}){{0,7}}$"


def _relative_path(path: str) -> str:
    # The pattern in words: pydantic's own message would print the regular expression.
    if not re.fullmatch(PATH_PATTERN, path):
        raise ValueError(
            "a file's path must be relative: up to 8 '/'-separated names of letters, digits,"
            " '.', '_' and '-', none starting with '.' (so no '..'), each at most 100 long"
        )
    return path


FilePath = Annotated[StrictStr, AfterValidator(_relative_path)]  # the schema says it too, below


def _question_and_answer(schema: dict[str, Any]) -> None:
    """What _has_question_and_answer checks, in the instance's JSON schema."""
    schema["anyOf"] = [
        {"required": ["question"], "properties": {"question": {"type": "string", "minLength": 1}}},
        {"required": ["prompt"], "properties": {"prompt": {"type": "array", "minItems": 1}}},
    ]
    schema["properties"]["files"]["propertyNames"] = {"pattern": PATH_PATTERN}
    schema["properties"]["answer"] = {"anyOf": [FINITE, {"type": "string", "pattern": r"\S"}]}
    # A tolerance is for a measured quantity: with one, the answer is a number with a fraction
    # (JSON Schema counts 3.0 as an integer; raas reads it as the float it is, and takes it).
    schema["if"] = {"required": ["rel_tol"], "properties": {"rel_tol": {"exclusiveMinimum": 0}}}
    schema["then"] = {"properties": {"answer": {"type": "number", "not": {"type": "integer"}}}}


def prompt_text(instance: LookupInstance) -> str:
    """Every text the model is shown before its first turn, as one string."""
    if isinstance(instance.prompt, list):
        return "\n".join(str(m.get("content", "")) for m in instance.prompt)
    return str(instance.question or "")


def in_text(answer: str | int | float, text: str) -> bool:
    """Whether ``answer`` stands in ``text`` as a whole word or number (347 is not in 3470)."""
    word = str(answer).strip()
    return bool(word) and re.search(rf"(?<![\w.]){re.escape(word)}(?![\w]|\.\d)", text) is not None


class LookupInstance(TaskInstance):
    model_config = ConfigDict(json_schema_extra=_question_and_answer)

    question: StrictStr | None = None
    prompt: list[dict[str, Any]] | None = None
    files: dict[FilePath, Annotated[StrictStr, Field(max_length=MAX_FILE_CHARS)]] = Field(
        min_length=1, max_length=MAX_FILES
    )
    answer: Scalar
    rel_tol: StrictFloat = Field(default=0.0, ge=0.0)

    @model_validator(mode="after")
    def _has_question_and_answer(self) -> Self:
        if not (self.question or self.prompt):
            raise located_error(("question",), "lookup needs the question (question or prompt)")
        if str(self.answer).strip() == "":
            raise located_error(("answer",), "lookup needs the answer")
        if self.rel_tol > 0 and not isinstance(self.answer, float):
            raise located_error(
                ("rel_tol",),
                "applies to a float answer only (a measured quantity, such as 3.5): an integer"
                " or a text answer (an id, a code) is matched exactly",
                self.rel_tol,
            )
        return self


def answer_is_right(given: str | None, truth: str | int | float, rel_tol: float = 0.0) -> bool:
    """Whether ``given`` (the finish tool's answer) is ``truth``, by the truth's type: an int is
    the one number ``given`` holds read exactly (see exact_number: ``7,318,200`` and ``7318200``
    are 7318200, a hedge is nothing), never through a float; a float is the one value it holds
    within ``rel_tol`` (check_numeric's ``one_value``); a text is ``given`` itself, trimmed,
    character for character (``"0042"`` is not ``42``)."""
    if given is None:
        return False
    if isinstance(truth, bool):  # never a Scalar; not the integer it subclasses either
        return False
    if isinstance(truth, int):
        return exact_number(given) == truth
    if isinstance(truth, float):
        return check_numeric(given, truth, rel_tol=rel_tol, one_value=True)
    return given.strip() == truth.strip()


class LookupTask(QuestionTask):
    name = "lookup"
    instance_model = LookupInstance
    tools: ClassVar[tuple[str | Tool, ...]] = ("bash", "finish")
    system_prompt = (
        "Answer the question from the files in your working directory: read them with the bash"
        " tool, then give the answer by calling finish."
    )

    async def setup(self, ctx: AgentContext) -> None:
        assert ctx.sandbox is not None
        parsed = LookupInstance.model_validate(ctx.job.instance)
        for path, text in parsed.files.items():
            await ctx.sandbox.write_file(path, text)

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        return {"answer": final_answer(None, ctx.answer)}

    async def judge(
        self, instance: dict[str, Any], artifact: dict[str, Any], services: TaskServices
    ) -> RewardInfo:
        given, truth = artifact.get("answer"), instance["answer"]
        correct = answer_is_right(given, truth, float(instance.get("rel_tol", 0.0)))
        leaked = in_text(truth, prompt_text(LookupInstance.model_validate(instance)))
        reward = 1.0 if correct else 0.0
        metrics = {"correct": correct, "given": given, "answer_in_prompt": leaked}
        return RewardInfo(reward, with_reason(reward, metrics, wrong_answer(given, truth)))
