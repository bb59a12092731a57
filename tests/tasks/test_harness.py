"""Harness tasks: the reference agent (real openai client) in a real sandbox, through the relay,
against a fake gateway session that scripts OpenAI answers; EVAL is the wrapped task's judge.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from raas.api.openapi import document_instances
from raas.client import to_batch
from raas.llm.models import load_tokenizer
from raas.llm.pool import BackendPool
from raas.llm.types import SamplingParams
from raas.pipeline import JobRequest, Pipeline, PipelineConfig
from raas.sandbox import BwrapConfig, SandboxError
from raas.sandbox.pydeps import staged_binds
from raas.settings import AgentSettings
from raas.store.sqlite import ResultStore
from raas.tasks import TaskRegistry
from raas.tasks.datasets import humaneval_problems
from raas.tasks.harness import HarnessContext, HarnessTask, agent_time_s
from raas.tasks.harness_node import NodeEnvironment, node_environment
from raas.tasks.protocol import InvalidInstance, TaskJob
from raas.tasks.services import TaskServices
from raas.wire import Trajectory
from tests.conftest import FIXTURES
from tests.support.llm_servers import AgentBackend, ServerThread
from tests.support.policies import call
from tests.tasks.test_harbor_instance import instance as harbor_instance

# Generous: these jobs end in seconds; a slow or loaded machine must fail a test as a timeout
# that says so, never as a verdict (the agent's own timeout is DEFAULT_AGENT_TIMEOUT_S, 600 s).
JOB_TIMEOUT_S = 900.0


def tool_call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": json.dumps(arguments)}


class FakeSession:
    """Answers /v1/chat/completions from a script; records every call in the trajectory.

    It has no tokens: its ``segments`` are what the test gives it."""

    def __init__(
        self,
        token: str,
        script: list[dict[str, Any]],
        trajectory: Trajectory,
        segments: list[Trajectory],
    ) -> None:
        self.token = token
        self.script = list(script)
        self.trajectory = trajectory
        self.segments = segments
        self.requests: list[dict[str, Any]] = []
        self.closed = False

    async def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        json_type = {"content-type": "application/json"}
        if headers.get("authorization") != f"Bearer {self.token}":
            return 401, json_type, b'{"error": {"message": "bad token"}}'
        if (method, path) != ("POST", "/v1/chat/completions") or not self.script:
            return 404, json_type, b'{"error": {"message": "not scripted"}}'
        request = json.loads(body)
        self.requests.append(request)
        step = self.script.pop(0)
        message: dict[str, Any] = {"role": "assistant", "content": step.get("content")}
        if "call" in step:
            message["tool_calls"] = [
                {"id": f"call_{len(self.requests)}", "type": "function", "function": step["call"]}
            ]
        self.trajectory.messages[:] = [*request["messages"], message]
        self.trajectory.turns.append({"request": len(self.requests)})
        answer = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": request["model"],
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if "call" in step else "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        return 200, json_type, json.dumps(answer).encode()

    def metrics(self) -> dict[str, Any]:
        return {"gateway_calls": len(self.requests)}


class FakeGateway:
    def __init__(
        self, script: list[dict[str, Any]], segments: list[Trajectory] | None = None
    ) -> None:
        self.script = script
        self.segments = segments or []
        self.sessions: list[FakeSession] = []

    def open(self, job_id: str, params: SamplingParams, trajectory: Trajectory) -> FakeSession:
        session = FakeSession(f"tok-{job_id}", self.script, trajectory, self.segments)
        self.sessions.append(session)
        return session

    def close(self, token: str) -> None:
        for session in self.sessions:
            if session.token == token:
                session.closed = True


class NoLLM:
    def __init__(self) -> None:
        self.released: list[str] = []

    async def generate(self, *args: Any) -> Any:
        raise AssertionError("a harness task generates through the gateway only")

    def release(self, session: str) -> None:
        self.released.append(session)


async def run_job(
    tmp_path: Path,
    instance: dict[str, Any],
    gateway: FakeGateway | None,
    services: TaskServices | None = None,
    task: HarnessTask | None = None,
) -> dict[str, Any]:
    """One harness job through a pipeline: with a scripted ``gateway`` (no model), or with
    ``services`` whose real gateway generates on their backends."""
    if services is None:
        services = TaskServices(llm=NoLLM(), sandbox_config=BwrapConfig())
    if gateway is not None:
        services.gateway = gateway  # type: ignore[assignment]
    registry = TaskRegistry()
    registry.register(task or HarnessTask())
    store = ResultStore(tmp_path / "raas.db")
    await store.open()
    pipeline = Pipeline(
        registry,
        store,
        PipelineConfig(job_timeout_s=JOB_TIMEOUT_S, cancel_grace_s=1),
        services=services,
    )
    await pipeline.start()
    try:
        await pipeline.submit([JobRequest.of({"data_source": "harness", **instance}, job_id="job")])
        view = await pipeline.wait("job", JOB_TIMEOUT_S + 60)
        assert view is not None and view.result is not None, (
            f"no result in {JOB_TIMEOUT_S}s: {view}"
        )
        result = view.result.model_dump(mode="json")
        # The agent's deadline is the machine's verdict, not the judge's: say so.
        stop = (result.get("metrics") or {}).get("stop_reason")
        assert stop != "agent_timeout", f"the agent timed out, so no verdict: {result}"
        assert result["state"] != "timeout", f"the job ran out of {JOB_TIMEOUT_S}s: {result}"
        return result
    finally:
        await pipeline.stop()
        await services.close()
        await store.close()


def humaneval_instance() -> tuple[dict[str, Any], str]:
    problem = next(p for p in humaneval_problems() if p["task_id"] == "HumanEval/0")
    instance = {
        "judge": "code",
        "instance_id": "HumanEval/0",
        **{k: problem[k] for k in ("prompt", "entry_point", "test")},
    }
    return instance, problem["prompt"] + problem["canonical_solution"]


async def test_the_reference_agent_solves_a_code_instance_through_the_relay(
    tmp_path: Path,
) -> None:
    instance, solution = humaneval_instance()
    write = f"cat > /workspace/solution.py <<'RAAS_EOF'\n{solution}\nRAAS_EOF"
    gateway = FakeGateway(
        [{"call": tool_call("bash", command=write)}, {"call": tool_call("finish", answer="done")}]
    )
    result = await run_job(tmp_path, instance, gateway)
    assert (result["state"], result["reward"]) == ("done", 1.0), result
    [session] = gateway.sessions
    assert session.closed and len(session.requests) == 2
    first, second = session.requests
    assert [t["function"]["name"] for t in first["tools"]] == ["bash", "finish"]
    assert "Complete this function" in first["messages"][-1]["content"]
    tool_reply = second["messages"][-1]
    assert tool_reply["role"] == "tool" and "[exit code 0]" in tool_reply["content"]
    # The trajectory is what the gateway recorded.
    assert result["trajectory"]["messages"][-1]["tool_calls"][0]["function"]["name"] == "finish"
    assert len(result["trajectory"]["turns"]) == 2
    assert result["metrics"]["stop_reason"] == "agent_exit_0"
    assert result["metrics"]["artifact"]["solution"].strip() == solution.strip()


async def test_a_wrong_solution_scores_zero_and_a_math_answer_is_judged(tmp_path: Path) -> None:
    instance, _ = humaneval_instance()
    wrong = instance["prompt"] + "    return False\n"
    write = f"cat > /workspace/solution.py <<'RAAS_EOF'\n{wrong}\nRAAS_EOF"
    gateway = FakeGateway([{"call": tool_call("bash", command=write)}, {"content": "done"}])
    result = await run_job(tmp_path / "a", instance, gateway)
    assert (result["state"], result["reward"]) == ("done", 0.0)

    math = {"judge": "math", "problem": "What is 6 * 7?", "answer": "42"}
    gateway = FakeGateway(
        [
            {"call": tool_call("bash", command="echo $((6*7))")},
            {"call": tool_call("finish", answer="42")},
        ]
    )
    result = await run_job(tmp_path / "b", math, gateway)
    assert (result["state"], result["reward"]) == ("done", 1.0), result
    assert "42" in gateway.sessions[0].requests[1]["messages"][-1]["content"]


async def test_a_gateway_segment_that_breaks_the_invariant_fails_the_job_saying_which(
    tmp_path: Path,
) -> None:
    math = {"judge": "math", "problem": "What is 6 * 7?", "answer": "42"}
    broken = Trajectory(prompt_ids=[1, 2], response_ids=[3], loss_mask=[1], logprobs=[])
    gateway = FakeGateway([{"call": tool_call("finish", answer="42")}], [Trajectory(), broken])
    result = await run_job(tmp_path, math, gateway)
    reason = (
        "gateway segment 1 breaks the token invariant:"
        " 1 response_ids but 1 loss_mask and 0 logprobs"
    )
    assert (result["state"], result["stage_failed"]) == ("failed", "run"), result
    assert result["error"] == {
        "type": "broken_trajectory",
        "message": reason,
        "kind": "infra",
        "stage": "run",
    }
    assert all(e["message"] == reason for e in result["attempt_errors"])  # retried, in vain
    # The rest is kept: the answer was right.
    assert result["reward"] == 1.0 and result["metrics"]["trajectory_error"] == reason


async def test_an_agent_that_crashes_before_calling_the_model_is_a_failed_job_saying_why(
    tmp_path: Path,
) -> None:
    math = {"judge": "math", "problem": "What is 6 * 7?", "answer": "42"}
    crash = "echo starting; python3 -c 'import no_such_agent_module'"
    gateway = FakeGateway([{"call": tool_call("finish", answer="42")}])  # never asked
    result = await run_job(tmp_path, {**math, "agent_command": crash}, gateway)
    assert (result["state"], result["stage_failed"], result["reward"]) == ("failed", "run", None)
    error = result["error"]
    assert (error["type"], error["kind"]) == ("PolicyError", "policy"), error  # not retried
    assert error["message"].startswith(
        "the agent program exited with status 1 without calling the model:"
        " ModuleNotFoundError: No module named 'no_such_agent_module'"
    )
    assert result["attempts"] == 1 and result["metrics"]["agent_exit_code"] == 1
    assert "starting" in result["metrics"]["agent_output"]
    assert result["trajectory"]["stop_reason"] == "agent_exit_1"
    assert gateway.sessions[0].requests == []


async def test_the_reference_agent_through_the_real_gateway_records_a_trajectory_that_trains(
    tmp_path: Path,
) -> None:
    """openai client in the sandbox -> relay -> GatewaySession -> backend pool -> a model (a
    vLLM-protocol server answering with real tool-call markup): what the result holds is what
    the model generated, token for token."""
    instance, solution = humaneval_instance()
    write = f"cat > /workspace/solution.py <<'RAAS_EOF'\n{solution}\nRAAS_EOF"

    def model(prompt: str) -> str:
        return (
            call("finish", answer="done") if "[exit code" in prompt else call("bash", command=write)
        )

    backend = ServerThread(AgentBackend(model).app).start()
    llm = BackendPool()
    llm.add(backend.url, "vllm", 8)
    services = TaskServices(llm=llm, tokenizer_name="tiny", sandbox_config=BwrapConfig())
    try:
        result = await run_job(tmp_path, instance, None, services)
    finally:
        await llm.stop()
        backend.stop()
    assert (result["state"], result["reward"]) == ("done", 1.0), result
    traj, metrics = result["trajectory"], result["metrics"]
    assert (metrics["gateway_calls"], metrics["gateway_segments"], metrics["gateway_drift"]) == (
        2,
        1,
        0,
    )
    assert len(traj["response_ids"]) == len(traj["loss_mask"]) == len(traj["logprobs"])
    generated = [t for t, m in zip(traj["response_ids"], traj["loss_mask"], strict=True) if m]
    assert 0 < len(generated) < len(traj["response_ids"])  # the tool output is masked out
    assert all(lp == -0.1 for lp, m in zip(traj["logprobs"], traj["loss_mask"], strict=True) if m)


AGENT_INSIDE = "/tmp/raas-test/gateway_agent.py"


class FixtureAgentHarness(HarnessTask):
    """The harness task, with tests/fixtures/gateway_agent.py written into the sandbox at INIT
    (a bind would need the checkout to be readable by the sandbox's uid)."""

    async def init(self, job: TaskJob) -> HarnessContext:
        ctx = await super().init(job)
        try:
            assert ctx.sandbox is not None
            await ctx.sandbox.write_file(AGENT_INSIDE, (FIXTURES / "gateway_agent.py").read_text())
        except BaseException:
            await self.cleanup(ctx)
            raise
        return ctx


def outward_address() -> str:
    """This host's address on its default route (no packet is sent), else a private one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            address = str(s.getsockname()[0])
        except OSError:
            return "10.0.0.1"
    return "10.0.0.1" if address.startswith(("0.", "127.")) else address


async def test_the_openai_package_in_a_sandbox_records_exactly_what_the_backend_generated(
    tmp_path: Path,
) -> None:
    """Issue 15's end-to-end test: the real openai package, inside a bwrap sandbox, drives a
    tool conversation through the relay, the real GatewaySession and backend pool, against a
    vLLM-protocol model server; then compacts its context, and tries another job's token, the
    model server's port and an outside address."""
    instance, solution = humaneval_instance()
    write = (
        f"cat > /workspace/solution.py <<'RAAS_EOF'\n{solution}\nRAAS_EOF\necho WRITTEN-$((6*7))"
    )
    check = "cd /workspace && python3 -c 'import solution; print(solution.__name__)'"

    def model(prompt: str) -> str:
        if "Summary of the work so far" in prompt:
            return "Done." + call("finish", answer="done")
        return call("bash", command=check if "WRITTEN-42" in prompt else write)

    # Each token its own logprob, so that a shift between tokens and logprobs shows.
    backend = AgentBackend(model, logprob=lambda i, token: -((token * 7 + i) % 1000 + 1) / 1000)
    server = ServerThread(backend.app).start()
    llm = BackendPool()
    llm.add(server.url, "vllm", 8)
    services = TaskServices(llm=llm, tokenizer_name="tiny", sandbox_config=BwrapConfig())
    other = services.gateway.open("job-2", SamplingParams(max_tokens=64), Trajectory())
    listener = socket.create_server(("0.0.0.0", 0))  # open to the host's network, not to a sandbox
    address = outward_address()
    outside = f"{address}:{listener.getsockname()[1]}"
    if address != "10.0.0.1":  # the host itself reaches it: a refusal inside is the sandbox's
        socket.create_connection((address, listener.getsockname()[1]), 2).close()
    command = (
        f"OTHER_TOKEN={other.token} BACKEND_PORT={server.port} OUTSIDE={outside}"
        f" python3 -s {AGENT_INSIDE}"
    )
    try:
        result = await run_job(
            tmp_path, {**instance, "agent_command": command}, None, services, FixtureAgentHarness()
        )
    finally:
        listener.close()
        await llm.stop()
        server.stop()
    assert (result["state"], result["reward"]) == ("done", 1.0), result
    metrics = result["metrics"]
    assert metrics["stop_reason"] == "agent_exit_0", metrics["agent_output"]
    [line] = [x for x in metrics["agent_output"].splitlines() if x.startswith("REPORT ")]
    report = json.loads(line.removeprefix("REPORT "))

    # Three calls reached the model; the segments hold exactly the tokens it returned.
    assert len(backend.returned) == 3 and metrics["gateway_calls"] == 3
    (p1, gen1, lp1), (p2, gen2, lp2), (p3, gen3, lp3) = backend.returned
    first, second = metrics["segments"]  # the compaction began a second segment
    assert metrics["gateway_segments"] == 2 and metrics["gateway_drift"] == 0
    assert first["prompt_ids"] == p1 and second["prompt_ids"] == p3
    for seg in (first, second):
        assert len(seg["response_ids"]) == len(seg["loss_mask"]) == len(seg["logprobs"])
    observation = first["response_ids"][len(gen1) : -len(gen2)]
    assert first["response_ids"] == gen1 + observation + gen2
    assert first["loss_mask"] == [1] * len(gen1) + [0] * len(observation) + [1] * len(gen2)
    assert first["logprobs"] == lp1 + [0.0] * len(observation) + lp2  # one-to-one, in order
    assert p2 == p1 + gen1 + observation  # the model saw its own tokens again, not a re-render
    assert "WRITTEN-42" in load_tokenizer("tiny").decode(observation)
    assert (second["response_ids"], second["loss_mask"], second["logprobs"]) == (
        gen3,
        [1] * len(gen3),
        lp3,
    )
    # The result's trajectory is the first segment.
    traj = result["trajectory"]
    assert (traj["response_ids"], traj["logprobs"]) == (first["response_ids"], first["logprobs"])
    assert [t["segment"] for t in traj["turns"]] == [0, 0, 1]
    # Both segments reach the trainer: two rows, each its segment's tokens, the job's reward.
    batch = to_batch([[result]])
    assert batch.segment_index.tolist() == [0, 1] and batch.rewards.tolist() == [1.0, 1.0]
    for row, seg in enumerate((first, second)):
        ids = seg["prompt_ids"] + seg["response_ids"]
        assert batch.input_ids[row, : len(ids)].tolist() == ids
        assert batch.loss_mask[row, len(seg["prompt_ids"]) : len(ids)].tolist() == seg["loss_mask"]
    # What the agent got back is what the model generated, logprobs included.
    assert [c["completion_tokens"] for c in report["calls"]] == [len(gen1), len(gen2), len(gen3)]
    assert [c["logprobs"] for c in report["calls"]] == [len(gen1), len(gen2), len(gen3)]
    assert [c["logprob_sum"] for c in report["calls"]] == [
        round(sum(lp), 6) for lp in (lp1, lp2, lp3)
    ]
    assert [c["tools"] for c in report["calls"]] == [["bash"], ["bash"], ["finish"]]

    # Another job's token is refused on every route; neither session was touched by it.
    assert (
        report["other_token"]
        == report["no_token"]
        == {"chat": 401, "responses": 401, "models": 401}
    )
    assert other.calls == 0 and other.segments == [] and other.trajectory.turns == []
    # No network: neither the model server on the host's loopback nor the host's address.
    assert report["backend"] == "ConnectionRefusedError"
    assert report["outside"] != "connected" and report["interfaces"] == ["lo"]


async def test_mini_swe_agent_without_an_agents_environment_fails_saying_what_to_build(
    tmp_path: Path,
) -> None:
    instance, _ = humaneval_instance()
    result = await run_job(tmp_path, {**instance, "agent": "mini-swe-agent"}, FakeGateway([]))
    assert (result["state"], result["stage_failed"]) == ("failed", "init")
    assert result["error"]["kind"] == "infra" and "--agents-venv" in result["error"]["message"]
    with pytest.raises(InvalidInstance) as err:
        HarnessTask().validate(TaskJob("j", {**instance, "agent": "no-such-agent"}, {}))
    assert err.value.loc[:2] == ("instance", "agent")


def test_the_harness_task_refuses_snapshots_and_its_document_says_so() -> None:
    # An agent program runs its own loop: no turn to branch from. The document says so (a fuzzer
    # found a schema-valid request refused when only the task knew).
    math = {"data_source": "harness", "judge": "math", "problem": "What is 6 * 7?", "answer": "42"}
    HarnessTask().validate(TaskJob("j", math, {"keep_snapshots": 0}))  # the control
    with pytest.raises(InvalidInstance) as err:
        HarnessTask().validate(TaskJob("j", math, {"keep_snapshots": 2}))
    assert err.value.loc == ("sampling_params", "keep_snapshots")
    assert "keeps no snapshots" in err.value.message
    document: dict[str, Any] = {"components": {"schemas": {"RolloutRequest": {}}}}
    document_instances(document, TaskRegistry.from_entry_points())
    params = document["components"]["schemas"]["Params.harness"]["properties"]
    assert params["keep_snapshots"]["anyOf"][0]["maximum"] == 0
    agentic = document["components"]["schemas"]["Params.swe"]["properties"]["keep_snapshots"]
    assert agentic["anyOf"][0]["maximum"] > 0


OWN_AGENT = """\
import json, os
from openai import OpenAI

messages = json.load(open(os.environ["RAAS_MESSAGES_FILE"]))
assert os.environ["RAAS_MESSAGES"] == os.environ["RAAS_MESSAGES_FILE"]  # the earlier name
# Anthropic's clients get the same gateway (they add /v1 themselves) and token.
assert os.environ["ANTHROPIC_BASE_URL"] + "/v1" == os.environ["OPENAI_BASE_URL"]
assert os.environ["ANTHROPIC_API_KEY"] == os.environ["OPENAI_API_KEY"]
# Gemini's too (the SDK adds /v1beta itself).
assert os.environ["GOOGLE_GEMINI_BASE_URL"] == os.environ["ANTHROPIC_BASE_URL"]
assert os.environ["GEMINI_API_KEY"] == os.environ["OPENAI_API_KEY"]
reply = OpenAI().chat.completions.create(model="policy", messages=messages)
open(os.environ["RAAS_ANSWER_FILE"], "w").write(reply.choices[0].message.content)
print("asked:", messages[-1]["content"])
here = os.environ["RAAS_AGENT_DIR"]
print("helper:", open(os.path.join(here, "lib", "helper.txt")).read())
for name in ("secret", "outside"):
    try:
        print(name + ":", open(os.path.join(here, name)).read())
    except OSError as e:
        print(name + ":", type(e).__name__)
try:
    open(os.path.join(here, "written"), "w")
    print("write: allowed")
except OSError as e:
    print("write:", type(e).__name__)
"""


async def test_your_own_agent_runs_from_the_service_s_agent_files(tmp_path: Path) -> None:
    """What the README's gateway section tells a user to do: the agent's directory is the
    service's agent_files, bound read-only at $RAAS_AGENT_DIR; a link in it to a host file
    outside brings nothing in (and that file's mode is left alone)."""
    agent = tmp_path / "my_agent"
    (agent / "lib").mkdir(parents=True)
    (agent / "agent.py").write_text(OWN_AGENT)
    (agent / "lib" / "helper.txt").write_text("bound in")
    secret = tmp_path / "key.txt"
    secret.write_text("HOST-SECRET")
    secret.chmod(0o600)
    (agent / "secret").symlink_to(secret)
    (agent / "outside").symlink_to("../key.txt")
    services = TaskServices(
        llm=NoLLM(), sandbox_config=BwrapConfig(), agents=AgentSettings(agent_files=agent)
    )
    math = {"judge": "math", "problem": "What is 6 * 7?", "answer": "42"}
    command = "python3 $RAAS_AGENT_DIR/agent.py"
    result = await run_job(
        tmp_path / "run",
        {**math, "agent_command": command},
        FakeGateway([{"content": "42"}]),
        services,
    )
    output = result["metrics"]["agent_output"]
    assert (result["state"], result["reward"]) == ("done", 1.0), output
    assert result["metrics"]["agent_exit_code"] == 0
    assert "asked: What is 6 * 7?" in output and "helper: bound in" in output
    assert "HOST-SECRET" not in output
    assert "secret: FileNotFoundError" in output and "outside: FileNotFoundError" in output
    assert "write: OSError" in output  # read-only (EROFS)
    assert secret.stat().st_mode & 0o777 == 0o600


async def test_an_agent_command_in_raas_agent_dir_without_agent_files_says_the_flag(
    tmp_path: Path,
) -> None:
    math = {"judge": "math", "problem": "What is 6 * 7?", "answer": "42"}
    instance = {**math, "agent_command": "python3 $RAAS_AGENT_DIR/agent.py"}
    result = await run_job(tmp_path, instance, FakeGateway([]))
    assert (result["state"], result["stage_failed"]) == ("failed", "init")
    assert "--agent-files DIR" in result["error"]["message"]


async def test_qwen_code_without_a_node_environment_fails_saying_what_to_build(
    tmp_path: Path,
) -> None:
    instance, _ = humaneval_instance()
    result = await run_job(tmp_path, {**instance, "agent": "qwen-code"}, FakeGateway([]))
    assert (result["state"], result["stage_failed"]) == ("failed", "init")
    assert result["error"]["kind"] == "infra"
    assert "--agents-node" in result["error"]["message"]
    assert "make agents-node" in result["error"]["message"]


def test_a_node_too_old_for_the_agent_s_package_is_named_at_init(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package's engines.node against the host's node: said at INIT, not as a syntax
    error inside the sandbox."""
    package = tmp_path / "env/node_modules/@qwen-code/qwen-code"
    package.mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"engines": {"node": ">=99.0.0"}}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "node").write_text("#!/bin/sh\necho v20.1.0\n")
    (bin_dir / "node").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(SandboxError, match=r"needs node >=99\.0\.0; .*node is v20\.1\.0"):
        node_environment(tmp_path / "env", "qwen-code")
    (package / "package.json").write_text(json.dumps({"engines": {"node": ">=20.0.0"}}))
    env = node_environment(tmp_path / "env", "qwen-code")
    assert (env.node, env.modules) == (bin_dir / "node", tmp_path / "env/node_modules")


def test_a_native_agent_s_engines_are_its_installer_s_and_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claude Code's package says node >=22 for its installer; its CLI is a program of its own,
    so a node 20 host runs it (and node is bound all the same)."""
    package = tmp_path / "env/node_modules/@anthropic-ai/claude-code"
    package.mkdir(parents=True)
    (package / "package.json").write_text(json.dumps({"engines": {"node": ">=22.0.0"}}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "node").write_text("#!/bin/sh\necho v20.1.0\n")
    (bin_dir / "node").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    env = node_environment(tmp_path / "env", "claude-code")
    assert env.modules == tmp_path / "env/node_modules"


def test_agent_files_are_staged_again_when_they_change(tmp_path: Path) -> None:
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "agent.py").write_text("print(1)\n")
    [(first, target)] = staged_binds(None, {str(agent): "/x"}, own_files=True).items()
    assert (target, (Path(first) / "agent.py").read_text()) == ("/x", "print(1)\n")
    (agent / "agent.py").write_text("print(2)\n")
    [second] = staged_binds(None, {str(agent): "/x"}, own_files=True)
    assert second != first and (Path(second) / "agent.py").read_text() == "print(2)\n"
    assert staged_binds(None, {str(agent): "/x"}, own_files=True) == {second: "/x"}


def harbor_harness(**fields: Any) -> dict[str, Any]:
    """A harness instance that wraps a Harbor task (test_harbor_instance's), with ``fields``."""
    return {**harbor_instance(), "data_source": "harness", "judge": "harbor", **fields}


@pytest.mark.parametrize(
    ("change", "loc", "said"),
    [
        (
            {"files": {**harbor_harness()["files"], "task.toml": "[verifier]\ntimeout = 1\n"}},
            ("instance", "files", "task.toml"),
            "verifier.timeout: Extra inputs are not permitted",
        ),
        (
            {"files": {k: v for k, v in harbor_harness()["files"].items() if k != "tests/test.sh"}},
            ("instance", "files"),
            "a Harbor task needs tests/test.sh",
        ),
        ({"reward_key": ""}, ("instance", "reward_key"), "at least 1 character"),
        ({"agent_timeout_s": 0}, ("instance", "agent_timeout_s"), "greater than 0"),
        ({"agent": "no-such-agent"}, ("instance", "agent"), "Input should be"),
    ],
)
def test_a_harness_instance_of_a_harbor_task_is_checked_as_both(
    change: dict[str, Any], loc: tuple[str, ...], said: str
) -> None:
    HarnessTask().validate(TaskJob("j", harbor_harness(), {}))  # the control: accepted
    with pytest.raises(InvalidInstance) as err:
        HarnessTask().validate(TaskJob("j", harbor_harness(**change), {}))
    assert err.value.loc[: len(loc)] == loc and said in err.value.message, err.value


async def test_a_bad_field_of_a_harness_harbor_instance_is_a_422_naming_it(
    client: Any, registry: TaskRegistry
) -> None:
    registry.register(HarnessTask())  # validation only: no job of it is run here
    bad = harbor_harness(files={**harbor_harness()["files"], "task.toml": "[agent]\nuser = 1\n"})
    async with client() as http:
        refused = await http.post("/v1/rollouts", json={"instance": bad})
        schema = (await http.get("/openapi.json")).json()["components"]["schemas"]
    assert refused.status_code == 422, refused.text
    [detail] = refused.json()["detail"]
    assert detail["loc"] == ["body", "instance", "files", "task.toml"]
    assert "task.toml: agent.user: Value error, raas runs each sandbox" in detail["msg"]
    # The document says it too: one branch of the harness instance is a Harbor task's.
    [harbor] = [
        b
        for b in schema["Instance.harness"]["anyOf"]
        if b["properties"]["judge"] == {"const": "harbor"}
    ]
    assert "tests/test.sh" in harbor["properties"]["files"]["required"]


@pytest.mark.parametrize(
    ("given", "task", "expected"),
    [
        (None, None, 600.0),
        (30.0, None, 30.0),
        (None, 900.0, 900.0),
        (30.0, 900.0, 30.0),
        (1200.0, 900.0, 900.0),
    ],
)
def test_the_agent_programs_time_is_the_shorter_of_the_instances_and_the_tasks(
    given: float | None, task: float | None, expected: float
) -> None:
    assert agent_time_s(given, task) == expected


def test_a_fork_of_a_harness_context_keeps_the_agents_environments(tmp_path: Path) -> None:
    """A group's job (a fork of the template's sandbox) runs the same agent: the npm agents'
    node environment comes with it, as mini-swe-agent's site-packages do."""
    node = NodeEnvironment(tmp_path / "node_modules", tmp_path / "node")
    template = HarnessContext(
        job=TaskJob("t", {}, {}), agent_site=tmp_path / "site", agent_node=node
    )
    sandbox: Any = object()  # forked() only carries it
    forked = HarnessTask().forked(template, TaskJob("j", {}, {}), sandbox)
    assert (forked.agent_site, forked.agent_node, forked.sandbox) == (
        tmp_path / "site",
        node,
        sandbox,
    )


def test_the_harbor_pages_harness_instance_is_one_the_server_takes() -> None:
    """docs/harbor.md's example of a harness agent on a Harbor task, as written."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "harbor.md").read_text()
    section = page.split("## Running a harness agent on a Harbor task", 1)[1]
    example = json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])
    HarnessTask().validate(TaskJob("j", example, {}))
    assert (example["judge"], example["agent"]) == ("harbor", "mini-swe-agent")
