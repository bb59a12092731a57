"""``swe``: fix a repository so that its failing tests pass (SWE-bench format).

Instance (``SweInstance``): ``problem_statement``, ``FAIL_TO_PASS`` and ``PASS_TO_PASS``
(unittest test ids; a JSON-encoded list, as SWE-bench's rows store them, is read as the list),
and the repository: a bundled ``snapshot`` ({"files": {path: content}}), or ``repo`` +
``base_commit`` as in SWE-bench / SWE-Gym / R2E-Gym, whose environments come as images
(``image_name`` / ``docker_image``): this task has no image support yet, so such an instance is
accepted and fails at INIT as an infra error that names the image it needs.

The tests are always run with ``TEST_COMMAND`` (``python3 -m unittest -v``, from the checkout's
root, on the listed ids), and that is the command the model is told about: an instance's own
``test_command`` is kept with the instance but neither shown nor run, since telling the model
one command and judging with another would teach it the wrong one.

INIT places the repository at /workspace/repo as a git checkout. EVAL takes the agent's
``git diff``, applies it to a fresh copy in a fresh sandbox, puts the original test files back
(an agent does not pass by editing tests), runs the listed tests, and resolves only if every
FAIL_TO_PASS test passes and every PASS_TO_PASS test still passes.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from raas.sandbox import Sandbox, SandboxError, ToolError
from raas.tasks.agentic import AgentContext, AgentTask, fresh_sandbox
from raas.tasks.protocol import RewardInfo, TaskInstance, Text, located_error
from raas.tasks.services import TaskServices
from raas.wire import Trajectory

REPO = "/workspace/repo"
TEST_TIMEOUT_S = 120.0
TEST_COMMAND = "python3 -m unittest -v"  # what the judge runs, and what the model is told
# unittest -v: "test_x (pkg.mod.Class.test_x) ... ok" (3.11+) or "test_x (pkg.mod.Class) ... ok"
UNITTEST_LINE = re.compile(
    r"^(\w+) \(([\w.]+)\)(?:\n[^\n]*?)?\s\.\.\.\s(ok|FAIL|ERROR|skipped|expected failure|"
    r"unexpected success)",
    re.MULTILINE,
)


def unittest_outcomes(output: str) -> dict[str, str]:
    outcomes = {}
    for name, where, status in UNITTEST_LINE.findall(output):
        test_id = where if where.endswith("." + name) else f"{where}.{name}"
        outcomes[test_id] = status
    return outcomes


def is_test_file(path: str) -> bool:
    parts = path.split("/")
    return parts[0] in {"tests", "test", "testing"} or parts[-1].startswith("test_")


async def materialise(sandbox: Sandbox, files: dict[str, str]) -> None:
    """The snapshot as a git checkout with one commit, tagged ``base``. Python's bytecode is
    ignored (as a repository's .gitignore would): an agent that ran the tests must not put
    binary .pyc files into its patch, which would then not apply."""
    for path, content in sorted(files.items()):
        await sandbox.write_file(f"{REPO}/{path}", content)
    result = await sandbox.bash(
        f"cd {REPO} && git init -q && printf '__pycache__/\\n*.py[co]\\n' >> .git/info/exclude"
        " && git config user.email agent@raas && git config user.name agent && git add -A"
        " && git commit -q -m base && git tag base && echo ok"
    )
    if result.exit_code != 0:
        raise SandboxError(f"could not make the git checkout: {result.output[-500:]}")


class Snapshot(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    files: dict[str, StrictStr] = Field(description="path in the repository -> file content")


class SweInstance(TaskInstance):
    problem_statement: Text
    FAIL_TO_PASS: list[StrictStr] = Field(min_length=1)
    PASS_TO_PASS: list[StrictStr] = Field(default_factory=list)
    snapshot: Snapshot | None = None
    repo: StrictStr | None = None
    base_commit: StrictStr | None = None

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _decode(cls, value: Any, info: ValidationInfo) -> Any:
        """SWE-bench's rows hold the lists as JSON text; a null PASS_TO_PASS is none."""
        if value is None and info.field_name == "PASS_TO_PASS":
            return []
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                return value  # not a list: the field's own check says so
        return value

    @model_validator(mode="after")
    def _has_a_repository(self) -> Self:
        if self.snapshot is None and not (self.repo and self.base_commit):
            raise located_error(
                ("snapshot",),
                "swe needs a snapshot (files by path) or a repo and its base_commit",
            )
        return self


class SweTask(AgentTask):
    name = "swe"
    instance_model = SweInstance
    tools = ("bash", "editor", "finish", "think")
    default_max_turns = 12
    system_prompt = (
        "You are a software engineer in a Linux sandbox. The repository is checked out at"
        f" {REPO}. Find the bug described in the issue and fix it in the source (not the"
        " tests). Run the tests with bash. When the fix is complete, call finish."
    )

    def messages(self, instance: dict[str, Any]) -> list[dict[str, Any]]:
        task = (
            f"Issue:\n{instance['problem_statement']}\n\nThe repository is at {REPO}; its tests"
            f" run with `{TEST_COMMAND}` from there."
        )
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": task},
        ]

    async def setup(self, ctx: AgentContext) -> None:
        instance = ctx.job.instance
        snapshot = instance.get("snapshot")
        if snapshot is None:
            image = instance.get("image_name") or instance.get("docker_image")
            raise SandboxError(
                f"{instance.get('instance_id')}: {instance.get('repo')} at"
                f" {instance.get('base_commit')} needs its environment image"
                f" ({image or 'the SWE-bench image of ' + str(instance.get('instance_id'))});"
                " the swe task runs bundled snapshots only"
            )
        assert ctx.sandbox is not None
        await materialise(ctx.sandbox, snapshot["files"])

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        if ctx.sandbox is None:
            return {"patch": ""}
        try:
            result = await ctx.sandbox.bash(
                f"cd {REPO} && git add -A && git diff --cached base", timeout_s=60
            )
        except (ToolError, SandboxError) as e:
            return {"patch": "", "error": str(e)}
        return {"patch": result.output if result.exit_code == 0 else ""}

    async def judge(
        self, instance: dict[str, Any], artifact: dict[str, Any], services: TaskServices
    ) -> RewardInfo:
        parsed = SweInstance.model_validate(instance)
        fail_to_pass, pass_to_pass = list(parsed.FAIL_TO_PASS), list(parsed.PASS_TO_PASS)
        patch = str(artifact.get("patch") or "")
        files = dict(instance["snapshot"]["files"])
        metrics: dict[str, Any] = {"patch_bytes": len(patch)}
        async with fresh_sandbox(services) as sandbox:
            await materialise(sandbox, files)
            if patch.strip():
                await sandbox.write_file(
                    "/tmp/agent.patch", patch if patch.endswith("\n") else patch + "\n"
                )
                applied = await sandbox.bash(
                    f"cd {REPO} && git apply --whitespace=nowarn /tmp/agent.patch"
                )
                metrics["patch_applied"] = applied.exit_code == 0
                if applied.exit_code != 0:
                    metrics["apply_output"] = applied.output[-1000:]
                    return RewardInfo(0.0, {**metrics, "resolved": False})
            else:
                metrics["patch_applied"] = False
            for path, content in files.items():  # the original tests, whatever the patch did
                if is_test_file(path):
                    await sandbox.write_file(f"{REPO}/{path}", content)
            ids = " ".join(shlex.quote(t) for t in fail_to_pass + pass_to_pass)
            run = await sandbox.bash(
                f"cd {REPO} && {TEST_COMMAND} {ids} 2>&1", timeout_s=TEST_TIMEOUT_S
            )
        outcomes = unittest_outcomes(run.output)
        f2p = {t: outcomes.get(t, "missing") for t in fail_to_pass}
        p2p = {t: outcomes.get(t, "missing") for t in pass_to_pass}
        resolved = all(s == "ok" for s in f2p.values()) and all(s == "ok" for s in p2p.values())
        metrics.update({"resolved": resolved, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})
        if not resolved:
            metrics["test_output"] = run.output[-2000:]
        return RewardInfo(1.0 if resolved else 0.0, metrics)
