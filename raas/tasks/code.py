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

EVAL copies the solution into a fresh sandbox and runs the tests there with time limits:
reward 1.0 if they all pass, else 0.0 with the (first) failure in the metrics.
"""

from __future__ import annotations

import json
import secrets
import shlex
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator

from raas.sandbox import SandboxError, ToolError
from raas.tasks.agentic import AgentContext, AgentTask, fresh_sandbox
from raas.tasks.protocol import RewardInfo, TaskInstance, Text, located_error
from raas.tasks.services import TaskServices
from raas.wire import Trajectory

SOLUTION = "/workspace/solution.py"
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


class CodeInstance(TaskInstance):
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
        parsed = CodeInstance.model_validate(instance)
        if parsed.reward_model is not None:
            return await judge_contest(code, parsed.reward_model.ground_truth, services)
        mark = secrets.token_hex(16)
        async with fresh_sandbox(services) as sandbox:
            await sandbox.write_file(SOLUTION, code)
            await sandbox.write_file("/workspace/tests.py", str(instance["test"]))
            await sandbox.write_file("/workspace/check.py", HUMANEVAL_HARNESS)
            result = await sandbox.bash(
                f"printf '%s\\n' {mark} | python3 /workspace/check.py {SOLUTION}"
                f" /workspace/tests.py {shlex.quote(str(instance['entry_point']))}",
                timeout_s=TEST_TIMEOUT_S,
            )
        passed = result.exit_code == 0 and mark in result.output.splitlines()
        metrics: dict[str, Any] = {"passed": passed, "timed_out": result.timed_out}
        if not passed:
            metrics["test_output"] = result.output[-2000:]
        return RewardInfo(1.0 if passed else 0.0, metrics)


async def judge_contest(code: str, tests: ContestTests, services: TaskServices) -> RewardInfo:
    """Run every case in a fresh sandbox, each in its own process with a time limit."""
    async with fresh_sandbox(services) as sandbox:
        await sandbox.write_file(SOLUTION, code)
        await sandbox.write_file("/workspace/tests.json", tests.model_dump_json())
        await sandbox.write_file("/workspace/run_tests.py", CONTEST_HARNESS)
        result = await sandbox.bash(
            f"python3 /workspace/run_tests.py /workspace/tests.json {SOLUTION} {CASE_TIMEOUT_S}",
            timeout_s=CONTEST_TIMEOUT_S,
        )
    summary: dict[str, Any] = {}
    for line in reversed(result.output.splitlines()):
        if line.startswith("{"):
            try:
                summary = json.loads(line)
            except json.JSONDecodeError:
                continue
            break
    total = len(tests.cases)
    passed = summary.get("passed") == total and result.exit_code == 0
    metrics: dict[str, Any] = {
        "passed": passed,
        "tests_passed": summary.get("passed", 0),
        "tests_total": total,
        "timed_out": result.timed_out,
    }
    if not passed:
        metrics["failure"] = summary.get("failure") or result.output[-2000:]
    return RewardInfo(1.0 if passed else 0.0, metrics)


# Runs in the judge's sandbox, on the image's python3 (3.8 or newer): argv is the solution, the
# tests (HumanEval's ``def check(candidate)``) and the entry point. It passes by printing a random
# mark it read from stdin before the solution ran: a solution that prints a success line and
# exits 0 before any test runs (a shortcut the oracle's sabotage takes, and which passed when
# the pass line was a fixed text after the tests) cannot know the mark. The tests run in the
# solution's namespace, as HumanEval's do (some call the prompt's helpers).
HUMANEVAL_HARNESS = r"""
import sys


def main():
    mark = sys.stdin.readline().strip()
    solution, tests, entry_point = sys.argv[1:4]
    namespace = {"__name__": "solution"}
    with open(solution) as f:
        exec(compile(f.read(), solution, "exec"), namespace)
    with open(tests) as f:
        exec(compile(f.read(), tests, "exec"), namespace)
    namespace["check"](namespace[entry_point])
    print(mark)


main()
"""

# Runs in the sandbox, on the image's python3 (3.8 or newer): argv is the tests file, the
# solution and the seconds each case may take. Prints one JSON line: how many passed in a row,
# and the first failure.
CONTEST_HARNESS = r'''
import json
import subprocess
import sys

CALL = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("solution", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
fn = getattr(module, sys.argv[2], None)
if fn is None and hasattr(module, "Solution"):
    fn = getattr(module.Solution(), sys.argv[2])
result = fn(*json.load(sys.stdin))
if isinstance(result, tuple):
    result = list(result)
sys.stdout.write("\\n@@raas-result@@" + json.dumps(result, default=repr) + "\\n")
"""


def lines(text):
    return [line.rstrip() for line in text.strip().splitlines()]


def same_output(got, want):
    return lines(got) == lines(want) or got.split() == want.split()


def returned(stdout):
    marks = [l for l in stdout.splitlines() if l.startswith("@@raas-result@@")]
    return json.loads(marks[-1][len("@@raas-result@@"):]) if marks else None


def main():
    tests = json.load(open(sys.argv[1]))
    solution, limit = sys.argv[2], float(sys.argv[3])
    name = tests.get("fn_name")
    cases = tests["cases"]
    for i, case in enumerate(cases):
        if name:
            cmd = [sys.executable, "-c", CALL, solution, name]
            stdin = json.dumps(case.get("args") or [])
        else:
            cmd = [sys.executable, solution]
            stdin = case.get("stdin") or ""
        failure = None
        try:
            run = subprocess.run(
                cmd, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                universal_newlines=True, timeout=limit,
            )
        except subprocess.TimeoutExpired:
            failure = "timed out after %gs" % limit
        else:
            want = case.get("expected")
            if run.returncode != 0:
                failure = "exit %d: %s" % (run.returncode, run.stderr[-1000:])
            elif name:
                got = returned(run.stdout)
                if not (got == want or [got] == want):
                    failure = "returned %s, expected %s" % (
                        json.dumps(got, default=repr)[:500], json.dumps(want, default=repr)[:500]
                    )
            elif not same_output(run.stdout, str(want)):
                failure = "printed %r, expected %r" % (run.stdout[:500], str(want)[:500])
        if failure is not None:
            print(json.dumps({"passed": i, "failure": {"case": i, "why": failure}}))
            return
    print(json.dumps({"passed": len(cases)}))


main()
'''
