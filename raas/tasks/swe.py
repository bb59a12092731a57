"""``swe``: fix a repository so that its failing tests pass (SWE-bench format).

Instance: ``problem_statement``, ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` (test ids), a
``test_command``, and the repository: a bundled ``snapshot`` ({"files": {path: content}}), or
``repo`` + ``base_commit`` as in SWE-bench / SWE-Gym / R2E-Gym, whose environments come as
images (the Apptainer provider; without one such an instance fails at INIT, saying so).

INIT places the repository at /workspace/repo as a git checkout. EVAL takes the agent's
``git diff``, applies it to a fresh copy in a fresh sandbox, puts the original test files back
(an agent does not pass by editing tests), runs the listed tests, and resolves only if every
FAIL_TO_PASS test passes and every PASS_TO_PASS test still passes.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from raas.sandbox import Sandbox, SandboxError, ToolError
from raas.tasks.agentic import AgentContext, AgentTask, fresh_sandbox
from raas.tasks.protocol import InvalidInstance, RewardInfo, TaskJob
from raas.tasks.services import TaskServices
from raas.wire import Trajectory

REPO = "/workspace/repo"
TEST_TIMEOUT_S = 120.0
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
    """The snapshot as a git checkout with one commit, tagged ``base``."""
    for path, content in sorted(files.items()):
        await sandbox.write_file(f"{REPO}/{path}", content)
    result = await sandbox.bash(
        f"cd {REPO} && git init -q && git config user.email agent@raas && git config"
        " user.name agent && git add -A && git commit -q -m base && git tag base && echo ok"
    )
    if result.exit_code != 0:
        raise SandboxError(f"could not make the git checkout: {result.output[-500:]}")


class SweTask(AgentTask):
    name = "swe"
    required = ("problem_statement", "FAIL_TO_PASS")
    tools = ("bash", "editor", "finish", "think")
    default_max_turns = 12
    system_prompt = (
        "You are a software engineer in a Linux sandbox. The repository is checked out at"
        f" {REPO}. Find the bug described in the issue and fix it in the source (not the"
        " tests). Run the tests with bash. When the fix is complete, call finish."
    )

    def validate(self, job: TaskJob) -> None:
        super().validate(job)
        instance = job.instance
        snapshot = instance.get("snapshot")
        if snapshot is None and not instance.get("repo"):
            raise InvalidInstance("instance.snapshot", "swe needs a snapshot or a repo")
        if snapshot is not None and not isinstance((snapshot or {}).get("files"), dict):
            raise InvalidInstance("instance.snapshot.files", "must map paths to file contents")
        for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):
            value = instance.get(key, [])
            if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
                raise InvalidInstance(f"instance.{key}", "must be a list of test ids")

    def messages(self, instance: dict[str, Any]) -> list[dict[str, Any]]:
        command = instance.get("test_command") or "python3 -m unittest"
        task = (
            f"Issue:\n{instance['problem_statement']}\n\nThe repository is at {REPO}; its tests"
            f" run with `{command}`."
        )
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": task},
        ]

    async def setup(self, ctx: AgentContext) -> None:
        instance = ctx.job.instance
        snapshot = instance.get("snapshot")
        if snapshot is None:
            raise SandboxError(
                f"{instance.get('instance_id')}: {instance.get('repo')} at"
                f" {instance.get('base_commit')} needs its environment image (SWE-bench"
                " images run with the apptainer sandbox provider); this server has none"
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
        fail_to_pass = list(instance.get("FAIL_TO_PASS", []))
        pass_to_pass = list(instance.get("PASS_TO_PASS", []))
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
                f"cd {REPO} && python3 -m unittest -v {ids} 2>&1", timeout_s=TEST_TIMEOUT_S
            )
        outcomes = unittest_outcomes(run.output)
        f2p = {t: outcomes.get(t, "missing") for t in fail_to_pass}
        p2p = {t: outcomes.get(t, "missing") for t in pass_to_pass}
        resolved = all(s == "ok" for s in f2p.values()) and all(s == "ok" for s in p2p.values())
        metrics.update({"resolved": resolved, "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})
        if not resolved:
            metrics["test_output"] = run.output[-2000:]
        return RewardInfo(1.0 if resolved else 0.0, metrics)
