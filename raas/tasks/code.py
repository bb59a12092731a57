"""``code``: write a program; hidden tests decide.

Two instance formats:

- HumanEval: ``prompt`` (signature and docstring), ``entry_point`` (the function's name),
  ``test`` (``def check(candidate): ...``). The agent completes /workspace/solution.py, which
  starts as the prompt.
- Contest rows, as verl-format code data holds them (PRIME/Eurus ``codecontests``, ``apps``,
  ``taco``, ``codeforces``; rLLM's ``deepcoder``; ProRL Agent's code data): ``prompt`` as chat
  messages (or that list as JSON text; the last user message is the problem) or plain text,
  and ``reward_model.ground_truth`` (a dict, or JSON text) holding the tests, either APPS's
  ``{"inputs": [...], "outputs": [...], "fn_name"?: ...}`` or LiveCodeBench's list of
  ``{"input", "output", "testtype": "stdin" | "functional", "metadata": {"func_name"}}``. The
  agent writes /workspace/solution.py: a program that reads stdin and writes stdout, or (when
  the tests name a function) that function, top-level or a method of ``Solution``.

EVAL writes the solution into a fresh sandbox and judges it there (raas.judge), the tests and
expected values out of the solution's reach, with time limits: reward 1.0 if they all pass,
else 0.0 with the (first) failure in the metrics.
"""

from __future__ import annotations

import json
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator

from raas import judge
from raas.judge.reasons import REASON
from raas.sandbox import SandboxError, ToolError
from raas.tasks.agentic import AgentContext, AgentTask, fresh_sandbox
from raas.tasks.protocol import RewardInfo, TaskInstance, Text, located_error
from raas.tasks.services import TaskServices
from raas.wire import Trajectory

SOLUTION = "/workspace/solution.py"
MAX_SOLUTION_BYTES = 1024 * 1024  # a solution beyond it is none (and not read)
TEST_TIMEOUT_S = 30.0
CASE_TIMEOUT_S = 6.0  # one contest test case
CONTEST_TIMEOUT_S = 120.0  # all of them
# What verl-format code rows append to the problem; here the solution goes in a file instead.
ANSWER_FORMAT = (
    "Write Python code to solve the problem. Present the code in \n```python\nYour code\n```\n"
    "at the end."
)


class PromptMessage(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    role: StrictStr
    content: StrictStr


class Case(BaseModel):
    """One contest test: a program's ``stdin`` or a function's ``args``, and what it must give."""

    model_config = ConfigDict(frozen=True)

    stdin: str | None = None
    args: list[Any] | None = None
    expected: Any


def _text(value: Any) -> str:
    """A stdin/stdout of a test as text (some datasets hold it as a list of lines)."""
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return str(value)


def _json(value: Any, what: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} is text but not JSON ({e.msg} at {e.pos})") from None


class ContestTests(BaseModel):
    """The tests of a contest row, from either format, as a list of cases."""

    model_config = ConfigDict(frozen=True)

    fn_name: StrictStr | None = None
    cases: list[Case] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _from_dataset(cls, data: Any) -> Any:
        data = _json(data, "ground_truth")
        if isinstance(data, dict) and "cases" in data:
            return data
        if isinstance(data, dict) and "inputs" in data:  # APPS / TACO / CodeContests
            inputs, outputs, name = data.get("inputs"), data.get("outputs"), data.get("fn_name")
            if not isinstance(inputs, list) or not isinstance(outputs, list):
                raise ValueError("ground_truth inputs and outputs must be lists")
            if len(inputs) != len(outputs):
                raise ValueError(f"ground_truth has {len(inputs)} inputs, {len(outputs)} outputs")
            if name:
                cases = [
                    {"args": i if isinstance(i, list) else [i], "expected": o}
                    for i, o in zip(inputs, outputs, strict=True)
                ]
            else:
                cases = [
                    {"stdin": _text(i), "expected": _text(o)}
                    for i, o in zip(inputs, outputs, strict=True)
                ]
            return {"fn_name": name or None, "cases": cases}
        if isinstance(data, list) and all(isinstance(t, dict) for t in data):  # LiveCodeBench
            cases, name = [], None
            for test in data:
                if test.get("testtype") == "functional":
                    meta = _json(test.get("metadata") or {}, "metadata")
                    name = meta.get("func_name") if isinstance(meta, dict) else None
                    text = str(test.get("input", ""))
                    args = [_json(line, "input") for line in text.split("\n") if line.strip()]
                    expected = _json(test.get("output"), "output")
                    cases.append({"args": args, "expected": expected})
                else:
                    stdin, stdout = _text(test.get("input", "")), _text(test.get("output", ""))
                    cases.append({"stdin": stdin, "expected": stdout})
            if any("args" in c for c in cases) and not name:
                raise ValueError("functional tests need metadata.func_name")
            return {"fn_name": name, "cases": cases}
        raise ValueError(
            'ground_truth must be {"inputs": [...], "outputs": [...]} or a list of'
            ' {"input", "output", "testtype"} tests'
        )


class RewardModel(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    ground_truth: ContestTests


def _one_format_schema(schema: dict[str, Any]) -> None:
    """What _one_format checks, in the instance's JSON schema: HumanEval's row (a text prompt,
    its entry_point and test) or a contest row (reward_model's tests, a prompt not empty)."""
    text = {"type": "string", "minLength": 1}
    humaneval = {
        "title": "HumanEval's row",
        "required": ["prompt", "entry_point", "test"],
        "properties": {"prompt": text, "entry_point": text, "test": text},
    }
    contest = {
        "title": "a contest row",
        "required": ["reward_model"],
        "properties": {
            "reward_model": {"type": ["object", "string"]},
            "prompt": {"anyOf": [text, {"type": "array", "minItems": 1}]},
        },
    }
    schema["anyOf"] = [humaneval, contest]


class CodeInstance(TaskInstance):
    model_config = ConfigDict(json_schema_extra=_one_format_schema)

    prompt: Text | list[PromptMessage]
    entry_point: Text | None = None
    test: Text | None = None
    reward_model: RewardModel | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _chat_as_text(cls, value: Any) -> Any:
        """A chat prompt stored as JSON text (as verl-format rows may) is read as the list."""
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:
                decoded = json.loads(value)
            except json.JSONDecodeError:
                return value
            return decoded if isinstance(decoded, list) else value
        return value

    @field_validator("reward_model", mode="before")
    @classmethod
    def _reward_model_text(cls, value: Any) -> Any:
        return _json(value, "reward_model")

    @model_validator(mode="after")
    def _one_format(self) -> Self:
        if self.reward_model is None:
            if not isinstance(self.prompt, str):
                raise located_error(
                    ("reward_model",), "a chat prompt needs reward_model.ground_truth (the tests)"
                )
            for name in ("entry_point", "test"):
                if getattr(self, name) is None:
                    raise located_error(
                        (name,), "Field required (HumanEval's, unless reward_model has the tests)"
                    )
        elif isinstance(self.prompt, list) and not self.prompt:
            raise located_error(("prompt",), "the chat prompt has no message")
        return self

    @property
    def problem(self) -> str:
        """A contest row's problem statement."""
        if isinstance(self.prompt, str):
            text = self.prompt
        else:
            users = [m.content for m in self.prompt if m.role == "user"]
            text = users[-1] if users else self.prompt[-1].content
        return text.replace(ANSWER_FORMAT, "").strip()


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
        parsed = CodeInstance.model_validate(instance)
        if parsed.reward_model is None:
            task = f"Complete this function in {SOLUTION}:\n\n```python\n{instance['prompt']}```"
            return [
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": task},
            ]
        name = parsed.reward_model.ground_truth.fn_name
        what = (
            f"a Python function `{name}` (top-level, or a method of class Solution)"
            if name
            else "a complete Python program that reads the input from stdin and prints the"
            " answer to stdout"
        )
        system = (
            "You are an expert Python programmer working in a Linux sandbox. Solve the problem"
            f" with {what}, written in {SOLUTION}. You can run it with bash to test it. When the"
            " solution is complete, call finish."
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": parsed.problem}]

    async def setup(self, ctx: AgentContext) -> None:
        assert ctx.sandbox is not None
        parsed = CodeInstance.model_validate(ctx.job.instance)
        humaneval = parsed.reward_model is None and isinstance(parsed.prompt, str)
        await ctx.sandbox.write_file(SOLUTION, str(parsed.prompt) if humaneval else "")

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        if ctx.sandbox is None:
            return {"solution": None}
        try:
            code = (await ctx.sandbox.read_file(SOLUTION, MAX_SOLUTION_BYTES)).decode(
                errors="replace"
            )
        except (ToolError, SandboxError):
            code = None
        return {"solution": code}

    async def judge(
        self, instance: dict[str, Any], artifact: dict[str, Any], services: TaskServices
    ) -> RewardInfo:
        code = artifact.get("solution")
        if not code:
            why = f"no solution: {SOLUTION} is missing or empty"
            return RewardInfo(0.0, {"passed": False, "error": "no solution file", REASON: why})
        parsed = CodeInstance.model_validate(instance)
        tests: judge.HumanEvalCheck | judge.ContestCases
        if parsed.reward_model is not None:
            truth = parsed.reward_model.ground_truth
            cases = [judge.Case(c.expected, c.stdin, c.args) for c in truth.cases]
            tests = judge.ContestCases(cases, truth.fn_name, CASE_TIMEOUT_S, CONTEST_TIMEOUT_S)
        else:
            prompt, test, entry = str(parsed.prompt), str(parsed.test), str(parsed.entry_point)
            tests = judge.HumanEvalCheck(prompt, test, entry, TEST_TIMEOUT_S)
        async with fresh_sandbox(services) as sandbox:
            verdict = await judge.judge_code(sandbox, code, SOLUTION, tests)
        return RewardInfo(1.0 if verdict.passed else 0.0, verdict.metrics)
