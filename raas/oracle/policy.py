"""What the oracle answers: the next step of a gold (or sabotaged) tool-call trajectory.

A trajectory is a plan, one step a turn; which step comes next is the number of turns the
prompt already holds, and a step reads what it needs from the observations so far (the line to
insert after, from the editor's view; the answer, from ipython's output). Every reply is a
sentence and Hermes ``<tool_call>{json}</tool_call>`` markup, as the agent loop parses it.

- code (HumanEval): view ``solution.py``, insert the canonical body after the last line the view
  shows, check that the file imports (bash), finish;
- swe: run the failing tests, write the gold patch (editor), ``git apply`` it (bash), run the
  tests, finish; a row in its own image works in /testbed and runs its tests with pytest;
- math: compute the answer with ipython (``math_solvers``: from the problem's text), then give
  the printed value to finish;
- stem: give the answer (the letter, or the number and its unit) to finish;
- harbor: write the task's ``solution/solve.sh`` to /tmp and run it with bash, with the task's
  ``[solution] env``, where the agent works (the image's WORKDIR), then finish.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from raas.llm.openai_chat import call_markup
from raas.oracle import sabotage
from raas.oracle.catalogue import GoldTask
from raas.oracle.math_solvers import solver_program
from raas.tasks.code import SOLUTION
from raas.tasks.harbor.instance import HarborInstance
from raas.tasks.swe import IMAGE_TEST_COMMAND, REPO, TEST_COMMAND, SweInstance, SweTask

PATCH_FILE = "/tmp/fix.patch"
UNKNOWN = (
    "I cannot place this task: the oracle answers raas's bundled tasks (humaneval, swe, math,"
    " stem) only."
)


@dataclass
class Turn:
    """One earlier turn of the conversation: the reply, and the observations that followed."""

    reply: str
    observations: list[str] = field(default_factory=list)


def chatml(text: str) -> list[tuple[str, str]]:
    """``(role, content)`` of each message of a ChatML conversation; the open assistant turn at
    the end (the generation prompt) is left out."""
    messages = []
    for part in text.split("<|im_start|>")[1:]:
        role, _, rest = part.partition("\n")
        closed = "<|im_end|>" in rest
        content = rest.split("<|im_end|>", 1)[0]
        if closed or content.strip():
            messages.append((role.strip(), content))
    return messages


def turns_after_task(messages: list[tuple[str, str]]) -> list[Turn]:
    """The turns after the last user message (the task)."""
    users = [i for i, (role, _) in enumerate(messages) if role == "user"]
    turns: list[Turn] = []
    for role, content in messages[users[-1] + 1 if users else 0 :]:
        if role == "assistant":
            turns.append(Turn(content))
        elif role == "tool" and turns:
            turns[-1].observations.append(content)
    return turns


Step = Callable[[list[Turn]], str]


def say(sentence: str, *calls: str) -> str:
    return "\n".join([sentence, *calls])


def call(name: str, **arguments: object) -> str:
    return call_markup(name, dict(arguments))


def plan(task: GoldTask, way: str | None) -> list[Step]:
    """The steps of ``task``'s trajectory; ``way`` is how it is sabotaged (None: gold)."""
    plans = {"code": _code, "swe": _swe, "math": _math, "stem": _stem, "harbor": _harbor}
    return plans[task.kind](task, way)


def next_reply(task: GoldTask, way: str | None, turns: list[Turn]) -> str:
    steps = plan(task, way)
    return steps[min(len(turns), len(steps) - 1)](turns)


def _finish(message: str) -> Step:
    return lambda turns: say("That is done.", call("finish", message=message))


# --- code -------------------------------------------------------------------------------------

_NUMBERED = re.compile(r"^\s*(\d+)\t(.*)$", re.MULTILINE)


def last_written_line(view: str) -> int | None:
    """The number of the last non-blank line in an editor view, or None if it shows none."""
    lines = [int(n) for n, text in _NUMBERED.findall(view) if text.strip()]
    return max(lines) if lines else None


def _code(task: GoldTask, way: str | None) -> list[Step]:
    body = sabotage.code_body(way, task.solution, str(task.instance["entry_point"]))
    prompt_lines = len(str(task.instance["prompt"]).rstrip("\n").split("\n"))

    def view(turns: list[Turn]) -> str:
        return say(
            "First I read the file to complete.", call("editor", command="view", path=SOLUTION)
        )

    def write(turns: list[Turn]) -> str:
        shown = last_written_line(turns[0].observations[0]) if turns[0].observations else None
        line = prompt_lines if shown is None else shown
        return say(
            f"The docstring ends on line {line}; the body goes after it.",
            call("editor", command="insert", path=SOLUTION, insert_line=line, new_str=body),
        )

    def check(turns: list[Turn]) -> str:
        command = "cd /workspace && python3 -c 'import solution' && echo imports"
        return say("Now I check that the file imports.", call("bash", command=command))

    return [view, write, check, _finish("solution.py is complete")]


# --- swe --------------------------------------------------------------------------------------


def _tests(repo: str, command: str, ids: list[str], lines: int) -> str:
    names = " ".join(shlex.quote(t) for t in ids)
    return f"cd {repo} && {command} {names} 2>&1 | tail -n {lines}"


@dataclass(frozen=True)
class _Fix:
    """The steps every SWE row's script shares: run the failing tests, write the patch, apply
    it, run the tests again (in ``repo``, with ``command``)."""

    repo: str
    command: str
    failing: list[str]
    passing: list[str]
    patch: str

    def reproduce(self, turns: list[Turn]) -> str:
        command = _tests(self.repo, self.command, self.failing, 20)
        return say("I run the failing tests first.", call("bash", command=command))

    def write_patch(self, turns: list[Turn]) -> str:
        return say(
            "I write the fix as a patch.",
            call("editor", command="create", path=PATCH_FILE, file_text=self.patch),
        )

    def apply(self, turns: list[Turn]) -> str:
        command = f"cd {self.repo} && git apply {PATCH_FILE} && git diff --stat"
        return say("I apply it.", call("bash", command=command))

    def verify(self, turns: list[Turn]) -> str:
        command = _tests(self.repo, self.command, self.failing + self.passing, 5)
        return say("I run the tests again.", call("bash", command=command))

    def script(self, way: str | None, wrong: Step, edit_tests: Step) -> list[Step]:
        """The gold script, or the sabotage ``way``: ``wrong`` runs after the patch is applied
        (``wrong_fix``), ``edit_tests`` instead of any patch (``edit_tests``)."""
        done = _finish("the issue is fixed")
        if way == "edit_tests":
            return [self.reproduce, edit_tests, self.verify, done]
        if way == "wrong_fix":
            return [self.reproduce, self.write_patch, self.apply, wrong, self.verify, done]
        return [self.reproduce, self.write_patch, self.apply, self.verify, done]


def _fix(task: GoldTask, way: str | None, repo: str, command: str) -> _Fix:
    parsed = SweInstance.model_validate(task.instance)
    patch = sabotage.broken_patch(task.solution) if way == "broken_patch" else task.solution
    return _Fix(repo, command, list(parsed.FAIL_TO_PASS), list(parsed.PASS_TO_PASS), patch)


def _swe(task: GoldTask, way: str | None) -> list[Step]:
    if SweInstance.model_validate(task.instance).image_ref is not None:
        return _swe_image(task, way)
    fix = _fix(task, way, REPO, TEST_COMMAND)

    def wrap(turns: list[Turn]) -> str:
        path = f"{REPO}/{sabotage.patched_file(task.solution)}"
        text = sabotage.WRONG_RESULTS.format(name=_tested_function(task))
        command = sabotage.append_command(path, text)
        return say("I adjust the results.", call("bash", command=command))

    def edit_tests(turns: list[Turn]) -> str:
        files = task.instance["snapshot"]["files"]
        calls = []
        for path, names in _test_methods(fix.failing).items():
            for old, new in sabotage.test_method_bodies(files[path], names):
                calls.append(
                    call(
                        "editor",
                        command="str_replace",
                        path=f"{REPO}/{path}",
                        old_str=old,
                        new_str=new,
                    )
                )
        return say("I make the failing tests pass.", *calls)

    return fix.script(way, wrap, edit_tests)


def _swe_image(task: GoldTask, way: str | None) -> list[Step]:
    """A row in its own image: the repository at /testbed, its tests pytest node ids. Sabotage:
    a patch that does not apply, the fix applied and then taken back (``wrong_fix``), or every
    assert of the failing tests' files made true (``edit_tests``)."""
    repo = SweTask.testbed
    fix = _fix(task, way, repo, IMAGE_TEST_COMMAND)

    def take_back(turns: list[Turn]) -> str:
        command = f"cd {repo} && git apply -R {PATCH_FILE}"
        return say("On second thought I undo it.", call("bash", command=command))

    def edit_tests(turns: list[Turn]) -> str:
        files = sorted({test_id.split("::")[0] for test_id in fix.failing})
        quoted = " ".join(shlex.quote(f) for f in files)
        command = f"cd {repo} && sed -i 's/^\\([ ]*\\)assert /\\1assert True or /' {quoted}"
        return say("I make the failing tests pass.", call("bash", command=command))

    return fix.script(way, take_back, edit_tests)


def _test_methods(test_ids: list[str]) -> dict[str, list[str]]:
    """unittest ids (``tests.test_x.Class.test_y``) as test methods by file."""
    by_file: dict[str, list[str]] = {}
    for test_id in test_ids:
        *module, _, method = test_id.split(".")
        by_file.setdefault("/".join(module) + ".py", []).append(method)
    return by_file


def _tested_function(task: GoldTask) -> str:
    """The function the tests import (``from pkg.solution import NAME``)."""
    for path, text in task.instance["snapshot"]["files"].items():
        if path.startswith("tests/"):
            match = re.search(r"^from [\w.]+ import (\w+)$", text, re.MULTILINE)
            if match is not None:
                return match.group(1)
    raise ValueError(f"{task.instance_id}: no tested function")


# --- math and stem ----------------------------------------------------------------------------


def computed_value(observation: str) -> str:
    """The last line ipython printed."""
    lines = [line.strip() for line in observation.splitlines() if line.strip()]
    value = lines[-1] if lines else ""
    return value.removeprefix("Out:").strip()


def _math(task: GoldTask, way: str | None) -> list[Step]:
    program = solver_program(str(task.instance["kind"]), str(task.instance["problem"]))

    def compute(turns: list[Turn]) -> str:
        return say("I compute the answer.", call("ipython", code=program))

    def answer(turns: list[Turn]) -> str:
        value = computed_value(turns[0].observations[0] if turns[0].observations else "")
        given = value
        if way is not None:
            try:
                wrong = sabotage.wrong_number(value)
            except (ValueError, ZeroDivisionError):
                wrong = value + "1"
            given = sabotage.hedge(wrong, value) if way == "hedge" else wrong
        return say(f"The answer is {given}.", call("finish", answer=given))

    return [compute, answer]


def _stem(task: GoldTask, way: str | None) -> list[Step]:
    instance = task.instance
    choices = instance.get("choices")
    if isinstance(choices, dict):
        right = str(instance["answer"])
        wrong = sabotage.wrong_letter(right, list(choices))
    else:
        value = float(instance["answer"])
        unit = f" {instance['unit']}" if instance.get("unit") else ""
        right = f"{instance['answer']}{unit}"
        rel_tol = float(instance.get("rel_tol", 0.01))
        wrong = sabotage.off_by_tolerance(value, rel_tol) + unit
    given = right if way is None else sabotage.hedge(wrong, right) if way == "hedge" else wrong

    def answer(turns: list[Turn]) -> str:
        return say(f"The answer is {given}.", call("finish", answer=given))

    return [answer]


# --- harbor -----------------------------------------------------------------------------------


def _harbor(task: GoldTask, way: str | None) -> list[Step]:
    if way == "no_op":
        return [_finish("Nothing to do.")]
    command = HarborInstance.model_validate(task.instance).gold_command()
    assert command is not None  # the catalogue holds Harbor tasks with their solve.sh

    def solve(turns: list[Turn]) -> str:
        return say("I will run the solution script.", call("bash", command=command))

    return [solve, _finish("The task is done.")]
