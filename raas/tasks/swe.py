"""``swe``: fix a repository so that its failing tests pass (SWE-bench format).

Instance (``SweInstance``): ``problem_statement``, ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (a
JSON-encoded list, as SWE-bench's rows store them, is read as the list), and the repository:

- a bundled ``snapshot`` ({"files": {path: content}}), its tests unittest ids. They are always
  run with ``TEST_COMMAND`` (``python3 -m unittest -v``, from the checkout's root, on the listed
  ids), and that is the command the model is told about: an instance's own ``test_command`` is
  kept with the instance but neither shown nor run, since telling the model one command and
  judging with another would teach it the wrong one. INIT places the repository at
  /workspace/repo as a git checkout of one commit (tag ``base``; no other history, refs or
  objects); EVAL judges the patch on a fresh copy in a fresh sandbox (raas.judge.swe: test paths
  put back, shadowing patches refused, tests run by id with canaries and a structured record).
- ``repo`` + ``base_commit``, as in SWE-bench / SWE-Gym / R2E-Gym: the row runs in its own image
  (raas.images.refs: ``image_name``, ``docker_image``, else SWE-Gym's name for its
  ``instance_id``), the repository at /testbed at its base commit (INIT checks it with the
  image's git), its tests pytest node ids (Django's unittest names, SymPy's function names),
  run with its own test command where the row carries swebench 5's ``eval_script`` (else as
  SWE-bench ran its version: raas.judge.swe_specs; a row whose command is not pytest, Django's
  runtests.py or SymPy's bin/test is refused), its ``test_patch`` applied after the agent's, and
  graded by SWE-bench's own parser and rules (raas.judge.swe_image).

Either way the artifact is the patch of what the agent left in the repository, taken without its
shell or its .git (raas.judge.swe_repo: the tree read as files, diffed in a fresh sandbox against
the snapshot or the image's own commit), and the row is resolved only if every FAIL_TO_PASS test
passes and every PASS_TO_PASS test still passes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from raas.images.errors import ImageError
from raas.images.refs import IMAGE_FIELDS, image_of
from raas.judge.code import Verdict
from raas.judge.swe import judge_swe
from raas.judge.swe_image import TESTBED, judge_swe_image
from raas.judge.swe_repo import (
    GIT_ENV,
    TreeError,
    image_tree_patch,
    materialise,
    read_tree,
    tree_patch,
)
from raas.judge.swe_repo import REPO as REPO
from raas.judge.swe_specs import DJANGO, SYMPY, RunPlan, UnsupportedTests, plan
from raas.judge.twins import UNITTEST, task_key, with_twins
from raas.sandbox import Sandbox, SandboxError, ToolError
from raas.tasks.agentic import AgentContext, AgentTask, fresh_sandbox
from raas.tasks.protocol import RewardInfo, TaskInstance, TaskJob, Text, located_error
from raas.tasks.services import TaskServices
from raas.wire import Trajectory

TEST_COMMAND = "python3 -m unittest -v"  # what the model is told; the judge runs these ids
# What the model is told of an image row's tests, by runner: SWE-bench's options, not the
# labels or files its test patch would give away.
IMAGE_TEST_COMMAND = "python3 -m pytest"
IMAGE_TEST_COMMANDS = {
    "pytest": IMAGE_TEST_COMMAND,
    DJANGO: "./tests/runtests.py --settings=test_sqlite --parallel 1",
    SYMPY: "bin/test -C --verbose",
}
SYSTEM_PROMPT = (
    "You are a software engineer in a Linux sandbox. The repository is checked out at"
    " {repo}. Find the bug described in the issue and fix it in the source (not the"
    " tests). Run the tests with bash. When the fix is complete, call finish."
)


# Not a kept sandbox (that is raas.agent.snapshots.Snapshot): the files a snapshot row carries.
class RepoSnapshot(BaseModel):
    """A repository's files, as a snapshot row gives them."""

    model_config = ConfigDict(extra="allow", frozen=True)

    files: dict[str, StrictStr] = Field(description="path in the repository -> file content")


def _one_of_the_rows(schema: dict[str, Any]) -> None:
    """What _has_a_repository checks, in the instance's JSON schema where JSON Schema can say
    it: a snapshot, or an image row with its repo, base_commit and image (or instance_id). An
    image row's eval_script (one pytest or runtests.py command between SWE-bench's markers) it
    cannot say, so the document admits an image row without one (its tests then run as
    SWE-bench ran its repository's)."""
    text = {"type": "string", "minLength": 1}
    named = [
        {"required": [key], "properties": {key: {"type": "string", "pattern": "[A-Za-z0-9]"}}}
        for key in IMAGE_FIELDS
    ]
    named.append({"required": ["instance_id"], "properties": {"instance_id": text}})
    no_script = {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 0}]}
    image_row = {
        "title": "an image row",
        "required": ["repo", "base_commit"],
        "properties": {"repo": text, "base_commit": text, "eval_script": no_script},
        "anyOf": named,
    }
    snapshot_row = {
        "title": "a snapshot row",
        "required": ["snapshot"],
        "properties": {"snapshot": {"type": "object"}},
    }
    schema["anyOf"] = [snapshot_row, image_row]


class SweInstance(TaskInstance):
    model_config = ConfigDict(json_schema_extra=_one_of_the_rows)

    problem_statement: Text
    FAIL_TO_PASS: list[StrictStr] = Field(min_length=1)
    PASS_TO_PASS: list[StrictStr] = Field(default_factory=list)
    snapshot: RepoSnapshot | None = None
    repo: StrictStr | None = None
    base_commit: StrictStr | None = None
    # An image row's (raas.judge.swe_specs): the tests the harness adds after the agent's patch,
    # and swebench 5's eval script (its pytest command), log parser and grading.
    test_patch: StrictStr = ""
    version: StrictStr | None = None  # SWE-bench's, for a Django row without an eval_script
    eval_script: StrictStr | None = None
    log_parser: StrictStr | None = None
    eval_type: StrictStr | None = None

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        """Some exports write a version as a number (4.2): the same version."""
        return (
            str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
        )

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
        if self.snapshot is None and self.image_ref is None:
            raise located_error(
                ("image_name",), "swe needs the image of a repo row (or its instance_id)"
            )
        if self.snapshot is None:
            try:
                self.plan()
            except UnsupportedTests as e:
                raise located_error(("eval_script",), str(e)) from e
        return self

    @property
    def image_ref(self) -> str | None:
        """The image this row runs in; None for a snapshot."""
        return None if self.snapshot is not None else image_of(self.model_dump())

    def plan(self) -> RunPlan:
        """How an image row's tests run and are graded."""
        ids = [*self.FAIL_TO_PASS, *self.PASS_TO_PASS]
        return plan(
            ids,
            self.eval_script,
            self.log_parser,
            self.eval_type,
            repo=self.repo,
            version=self.version,
            test_patch=self.test_patch,
        )


class SweTask(AgentTask):
    name = "swe"
    instance_model = SweInstance
    tools = ("bash", "editor", "finish", "think")
    default_max_turns = 12
    system_prompt = SYSTEM_PROMPT.format(repo=REPO)
    # Where an image row's repository is (a parameter, so that a plain sandbox can stand in for
    # an image in tests).
    testbed: ClassVar[str] = TESTBED

    def messages(self, instance: dict[str, Any]) -> list[dict[str, Any]]:
        parsed = SweInstance.model_validate(instance)
        image = parsed.image_ref is not None
        repo, command = (REPO, TEST_COMMAND)
        if image:
            repo, command = self.testbed, IMAGE_TEST_COMMANDS[parsed.plan().runner]
        task = (
            f"Issue:\n{instance['problem_statement']}\n\nThe repository is at {repo}; its tests"
            f" run with `{command}` from there."
        )
        system = SYSTEM_PROMPT.format(repo=repo) if image else self.system_prompt
        return [{"role": "system", "content": system}, {"role": "user", "content": task}]

    async def init(self, job: TaskJob) -> AgentContext:
        """An image row's sandbox is of its image; a snapshot's, of the configured kind."""
        self.validate(job)
        image = SweInstance.model_validate(job.instance).image_ref
        if image is None:
            return await super().init(job)
        ctx = AgentContext(job=job)
        async with self.cleaned_up_on_error(ctx):
            ctx.sandbox = await _image_sandbox(self.services_of(job), job.instance, image)
            ctx.closing.append(ctx.sandbox)
            await self.setup(ctx)
        return ctx

    async def setup(self, ctx: AgentContext) -> None:
        assert ctx.sandbox is not None
        instance = SweInstance.model_validate(ctx.job.instance)
        if instance.snapshot is not None:
            await materialise(ctx.sandbox, dict(instance.snapshot.files))
            return
        head = await ctx.sandbox.exec(["git", "rev-parse", "HEAD"], cwd=self.testbed, env=GIT_ENV)
        found = head.stdout.strip()
        if head.exit_code != 0 or not found.startswith(str(instance.base_commit)):
            raise SandboxError(
                f"{_named(ctx.job.instance)}: {self.testbed} in {instance.image_ref} is at"
                f" {found or (head.stdout + head.stderr).strip()[-300:]}, not at the row's"
                f" base_commit {instance.base_commit}"
            )

    async def artifact(self, ctx: AgentContext, trajectory: Trajectory) -> dict[str, Any]:
        if ctx.sandbox is None:
            return {"patch": ""}
        instance = SweInstance.model_validate(ctx.job.instance)
        try:
            tree = await read_tree(ctx.sandbox, self.testbed if instance.image_ref else REPO)
        except (ToolError, SandboxError, TreeError) as e:  # what the agent left cannot be read
            return {"patch": "", "error": str(e)}
        services = self.services_of(ctx.job)
        try:
            async with _fresh(services, ctx.job.instance, instance.image_ref) as clean:
                if instance.snapshot is not None:
                    patch = await tree_patch(clean, dict(instance.snapshot.files), tree)
                else:
                    patch = await image_tree_patch(clean, tree, self.testbed)
        except TreeError as e:
            return {"patch": "", "error": str(e)}
        return {"patch": patch}

    async def judge(
        self, instance: dict[str, Any], artifact: dict[str, Any], services: TaskServices
    ) -> RewardInfo:
        parsed = SweInstance.model_validate(instance)
        patch = str(artifact.get("patch") or "")

        async def run(patch: str, twins: dict[str, str] | None) -> Verdict:
            # A twin run runs the same tests as the real one (fewer would tell it apart); the
            # twins alone decide it.
            async with _fresh(services, instance, parsed.image_ref) as sandbox:
                if parsed.snapshot is not None:
                    return await judge_swe(
                        sandbox,
                        files=dict(parsed.snapshot.files),
                        patch=patch,
                        fail_to_pass=list(parsed.FAIL_TO_PASS),
                        pass_to_pass=list(parsed.PASS_TO_PASS),
                        twins=twins,
                    )
                return await judge_swe_image(
                    sandbox,
                    patch=patch,
                    fail_to_pass=list(parsed.FAIL_TO_PASS),
                    pass_to_pass=list(parsed.PASS_TO_PASS),
                    plan=parsed.plan(),
                    test_patch=parsed.test_patch,
                    base_commit=parsed.base_commit,
                    repo=self.testbed,
                    twins=twins,
                )

        verdict = await with_twins(
            run,
            patch,
            deciding=list(parsed.FAIL_TO_PASS),
            runner=UNITTEST if parsed.snapshot is not None else parsed.plan().runner,
            key=task_key(instance),
            gold=gold_patch(instance),
        )
        return RewardInfo(1.0 if verdict.passed else 0.0, verdict.metrics)


def gold_patch(instance: dict[str, Any]) -> str | None:
    """The row's gold patch, which calibrates the twins: the bundled rows' ``gold_patch``,
    SWE-bench's ``patch``."""
    gold = instance.get("gold_patch") or instance.get("patch")
    return gold if isinstance(gold, str) and gold.strip() else None


def _named(instance: dict[str, Any]) -> str:
    return (
        f"{instance.get('instance_id')} ({instance.get('repo')} at {instance.get('base_commit')})"
    )


async def _image_sandbox(services: TaskServices, instance: dict[str, Any], image: str) -> Sandbox:
    """A sandbox of ``image``, or an infra error that names the image and why there is none."""
    try:
        return await services.sandbox(image=image)
    # An image the store lacks or raas cannot run is an ImageError, not a SandboxError (the
    # store sits below the sandboxes): both are an infra failure that names the image.
    except (SandboxError, ImageError) as e:  # the same class: whether a retry may help stays
        raise type(e)(f"{_named(instance)} needs its environment image {image}: {e}") from e


@asynccontextmanager
async def _fresh(
    services: TaskServices, instance: dict[str, Any], image: str | None
) -> AsyncIterator[Sandbox]:
    """A sandbox the agent never touched: of the row's image, or of the configured kind."""
    if image is None:
        async with fresh_sandbox(services) as sandbox:
            yield sandbox
        return
    sandbox = await _image_sandbox(services, instance, image)
    try:
        yield sandbox
    finally:
        await sandbox.close()
