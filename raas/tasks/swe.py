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

INIT places the repository at /workspace/repo as a git checkout of one commit (tag ``base``;
no other history, refs or objects). The artifact is the patch of what the agent left there,
taken without its shell or its .git (raas.judge.swe_repo: the tree read as files, diffed in a
fresh sandbox against the snapshot). EVAL judges the patch on a fresh copy in a fresh sandbox
(raas.judge.swe: test paths put back, shadowing patches refused, tests run by id with canaries
and a structured record), and resolves only if every FAIL_TO_PASS test passes and every
PASS_TO_PASS test still passes.
"""

from __future__ import annotations

import json
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

from raas.judge.swe import judge_swe
from raas.judge.swe_repo import REPO as REPO
from raas.judge.swe_repo import TreeError, materialise, read_tree, tree_patch
from raas.sandbox import SandboxError, ToolError
from raas.tasks.agentic import AgentContext, AgentTask, fresh_sandbox
from raas.tasks.protocol import RewardInfo, TaskInstance, Text, located_error
from raas.tasks.services import TaskServices
from raas.wire import Trajectory

TEST_COMMAND = "python3 -m unittest -v"  # what the model is told; the judge runs these ids


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
            tree = await read_tree(ctx.sandbox)
        except (ToolError, SandboxError, TreeError) as e:  # what the agent left cannot be read
            return {"patch": "", "error": str(e)}
        async with fresh_sandbox(self.services_of(ctx.job)) as clean:
            try:
                patch = await tree_patch(clean, ctx.job.instance["snapshot"]["files"], tree)
            except TreeError as e:
                return {"patch": "", "error": str(e)}
        return {"patch": patch}

    async def judge(
        self, instance: dict[str, Any], artifact: dict[str, Any], services: TaskServices
    ) -> RewardInfo:
        parsed = SweInstance.model_validate(instance)
        if parsed.snapshot is None:
            raise SandboxError(f"{instance.get('instance_id')}: the swe task judges snapshots only")
        async with fresh_sandbox(services) as sandbox:
            verdict = await judge_swe(
                sandbox,
                files=dict(parsed.snapshot.files),
                patch=str(artifact.get("patch") or ""),
                fail_to_pass=list(parsed.FAIL_TO_PASS),
                pass_to_pass=list(parsed.PASS_TO_PASS),
            )
        return RewardInfo(1.0 if verdict.passed else 0.0, verdict.metrics)
