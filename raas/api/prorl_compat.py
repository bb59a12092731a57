"""What ProRL Agent's clients send, in raas's terms, and raas's results in theirs.

The clients are ProRL Agent's trainer integration (NVIDIA-NeMo/ProRL-Agent-Server,
``trainer_integration/verl/verl_custom/nvidia/rollout/async_server.py``, as its forks keep it)
and NeMo Gym's prorl agent (NVIDIA-NeMo/Gym, ``responses_api_agents/prorl_agent``). ProRL's
own server passes
``sampling_params`` to OpenHands' ``LLMConfig`` (which forbids unknown keys) after taking out
its agent-config keys (``openhands/nvidia/registry.py``), so the keys a ProRL client may send
are exactly those two lists. Here each one is either mapped to raas's name, passed on when the
task takes it, or recorded as unused; a key that neither raas nor ProRL knows goes on to the
task, which rejects it by name, as raas's own routes do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from raas.agent.loop import LoopParams
from raas.agent.tools import schema, select_tools
from raas.tasks import TaskHandler, TaskRegistry, UnknownTask
from raas.tasks.protocol import InvalidInstance
from raas.wire import ProRLMessage, ProRLResult, ProRLTiming, RolloutResult, Trajectory

DEFAULT_DATA_SOURCE = "swebench"  # ProRL's server: instance.get("data_source", "swebench")

# ProRL's names for what raas has under another name.
RENAMED = {
    "max_iterations": "max_turns",  # agent config: turns of the agent loop
    "max_output_tokens": "max_tokens",  # LLMConfig: new tokens per generation
    "max_model_len": "max_context_tokens",  # LLMConfig: prompt + output limit
}
# ProRL's agent-config keys (registry.py _DEFAULT_AGENT_CONFIG) and OpenHands' LLMConfig
# fields; "max_tokens" is in ProRL's README example.
PRORL_KEYS = frozenset(
    {
        "max_iterations",
        "ensure_thinking_end_properly",
        "strict_loop_detector",
        "enable_vision",
        "enable_a11y_tree",
        "model",
        "api_key",
        "base_url",
        "api_version",
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_region_name",
        "openrouter_site_url",
        "openrouter_app_name",
        "num_retries",
        "retry_multiplier",
        "retry_min_wait",
        "retry_max_wait",
        "timeout",
        "max_message_chars",
        "temperature",
        "top_p",
        "top_k",
        "custom_llm_provider",
        "max_input_tokens",
        "max_output_tokens",
        "input_cost_per_token",
        "output_cost_per_token",
        "ollama_base_url",
        "drop_params",
        "modify_params",
        "disable_vision",
        "caching_prompt",
        "log_completions",
        "log_completions_folder",
        "custom_tokenizer",
        "native_tool_calling",
        "reasoning_effort",
        "seed",
        "enable_thinking",
        "token_level_generation",
        "max_model_len",
        "max_tokens",
    }
)
SECRETS = frozenset({"api_key", "aws_access_key_id", "aws_secret_access_key"})
REDACTED = "<redacted>"


@dataclass
class ProRLCall:
    """A /process request in raas's terms."""

    instance: dict[str, Any]  # data_source: the row's own, or ProRL's default
    sampling_params: dict[str, Any]  # what the task gets
    handler: TaskHandler | None  # None when data_source names no task (the submit says so)
    prorl_data_source: Any = None
    renamed: dict[str, str] = field(default_factory=dict)  # raas key -> the ProRL key sent
    unused: dict[str, Any] = field(default_factory=dict)  # ProRL keys raas has no use for

    def locate(self, error: Exception) -> Exception:
        """``error`` (from the task's checks) naming the key the client sent, not raas's."""
        if isinstance(error, InvalidInstance) and error.loc[:1] == ("sampling_params",):
            sent = self.renamed.get(str(error.loc[1])) if len(error.loc) > 1 else None
            if sent is not None:
                loc = ("sampling_params", sent, *error.loc[2:])
                return InvalidInstance(loc, f"{error.message} (raas's {error.loc[1]})", error.kind)
        return error

    def record(self) -> dict[str, Any]:
        """What goes to the answer's ``metrics.prorl``."""
        return {
            "data_source": self.prorl_data_source,
            "renamed_sampling_params": {sent: key for key, sent in self.renamed.items()},
            "unused_sampling_params": self.unused,
        }


def raas_task(data_source: Any, registry: TaskRegistry) -> Any:
    """The raas task that runs a ProRL row's data_source (ProRL's names are aliases in
    raas.tasks.sources); the name itself when no task runs it (the submission then says so)."""
    if data_source is None:
        data_source = DEFAULT_DATA_SOURCE
    if not isinstance(data_source, str):
        return data_source
    try:
        return registry.resolve(data_source)
    except UnknownTask:
        return data_source


def params_model(handler: object) -> type[BaseModel]:
    """The model of the sampling_params a task takes: its own, or (a task that declares none)
    the agent loop's."""
    model = getattr(handler, "params_model", None)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model
    return LoopParams


def accepted_keys(handler: TaskHandler | None) -> frozenset[str]:
    """The sampling_params keys the task takes."""
    return frozenset(params_model(handler).model_fields)


def prorl_params_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A task's sampling_params ``schema`` as /process takes them (see prorl_call): ProRL's
    names for raas's keys too, and ProRL's other keys with any value (listed as unused)."""
    properties = dict(schema.get("properties", {}))
    for sent, key in RENAMED.items():
        if key in properties:
            properties[sent] = properties[key]
    for key in PRORL_KEYS - properties.keys():
        properties[key] = {}
    return {**schema, "properties": properties}


def prorl_call(
    instance: dict[str, Any], sampling_params: dict[str, Any], registry: TaskRegistry
) -> ProRLCall:
    sent_source = instance.get("data_source")
    task = raas_task(sent_source, registry)
    handler = registry.get(task) if isinstance(task, str) and task in registry else None
    # The row keeps its own name (the result says which task ran it); a row without one is
    # ProRL's default.
    source = DEFAULT_DATA_SOURCE if sent_source is None else sent_source
    call = ProRLCall({**instance, "data_source": source}, {}, handler, sent_source)
    takes = accepted_keys(handler)
    for key, value in sampling_params.items():
        target = RENAMED.get(key, key)
        if target in takes and not (target != key and target in sampling_params):
            call.sampling_params[target] = value
            if target != key:
                call.renamed[target] = key
        elif key in PRORL_KEYS:  # raas's own key wins over ProRL's name for it
            call.unused[key] = REDACTED if key in SECRETS and value is not None else value
        else:
            call.sampling_params[key] = value  # the task names it in its 422
    return call


def tool_schemas(handler: TaskHandler | None) -> list[dict[str, Any]]:
    """The tools an agent task shows the model, as ChatCompletion function schemas."""
    tools = getattr(handler, "tools", ())
    try:
        return [schema(tool) for tool in select_tools(tools).values()]
    except (TypeError, ValueError):  # not an agent task's tools
        return []


def _echo(value: Any) -> str | int | None:
    """An id as the client sent it (the trainer numbers trajectories 0, 1...), else as text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return str(value)


def _turn_spans(traj: Trajectory) -> list[tuple[int, int]] | None:
    """Each assistant turn's [start, end) in prompt_ids + response_ids, from the turn records;
    None when they do not describe the token lists (a task without turn records)."""
    total = len(traj.prompt_ids) + len(traj.response_ids)
    assistants = sum(1 for m in traj.messages if m.get("role") == "assistant")
    if not traj.turns or len(traj.turns) != assistants:
        return None
    spans, end = [], len(traj.prompt_ids)
    for turn in traj.turns:
        start, n = turn.get("prompt_tokens"), turn.get("output_tokens")
        if not isinstance(start, int) or not isinstance(n, int) or start < end or n < 0:
            return None
        end = start + n
        spans.append((start, end))
    if spans[0][0] != len(traj.prompt_ids) or end > total:
        return None
    return spans


def prorl_messages(traj: Trajectory) -> list[ProRLMessage]:
    """The trajectory's messages with their tokens, as ProRL's clients read them."""
    ids = traj.prompt_ids + traj.response_ids
    offset = len(traj.prompt_ids)  # where response_ids (and logprobs) start in ids
    spans = _turn_spans(traj)
    out: list[ProRLMessage] = []
    turn, cursor, first_of_run = 0, 0, True
    for message in traj.messages:
        role = str(message.get("role", ""))
        content = message.get("content")
        text = content if isinstance(content, str) else "" if content is None else str(content)
        if role != "assistant":
            tokens: list[int] = []
            if spans is not None and first_of_run:
                end = spans[turn][0] if turn < len(spans) else len(ids)
                tokens, cursor = ids[cursor:end], end
            first_of_run = False
            out.append(ProRLMessage(role=role, content=text, token_ids=tokens))
            continue
        record = traj.turns[turn] if turn < len(traj.turns) else {}
        calls = record.get("tool_calls")
        msg = ProRLMessage(
            role=role,
            # The text around the calls, as ProRL sends it (the calls are in tool_calls).
            content=str(record.get("content", text)) if calls else text,
            tool_calls=[{"name": c.get("name"), "arguments": c.get("arguments")} for c in calls]
            if isinstance(calls, list) and calls
            else None,
        )
        if spans is not None:
            start, end = spans[turn]
            msg.token_ids, msg.input_ids = ids[start:end], ids[:start]
            msg.logprobs = traj.logprobs[start - offset : end - offset]
            cursor = end
        out.append(msg)
        turn += 1
        first_of_run = True
    return out


def _resolved(result: RolloutResult) -> bool:
    resolved = result.metrics.get("resolved")
    if isinstance(resolved, bool):
        return resolved
    return result.reward is not None and result.reward > 0.99  # ProRL: score > 0.99


def prorl_result(result: RolloutResult, call: ProRLCall, sent: dict[str, Any]) -> ProRLResult:
    """The ProRL-shaped answer for ``result`` of the /process request whose instance was
    ``sent``."""
    traj, error = result.trajectory, result.error
    critical: Any = None
    if result.state in ("timeout", "cancelled"):
        critical = "timeout"  # ProRL marks a cancelled job timed out too
    elif result.state == "failed" and error is not None and error.kind == "infra":
        critical = error.stage or "init"
    success = result.state == "done"
    last = traj.turns[-1] if traj.turns else {}
    artifact = result.metrics.get("artifact")
    patch = artifact.get("patch") if isinstance(artifact, dict) else None
    in_stages = result.timing.init_s + result.timing.run_s + result.timing.eval_s
    return ProRLResult(
        instance_id=_echo(sent.get("instance_id")),
        trajectory_id=_echo(sent.get("trajectory_id")),
        git_patch=patch if isinstance(patch, str) and patch else None,
        success=success,
        finish=traj.stop_reason == "finish",
        messages=prorl_messages(traj),
        tools=tool_schemas(call.handler),
        end_properly=not last.get("format_errors") and last.get("finish_reason") != "length",
        resolved=success and _resolved(result),
        reward=result.reward,
        critical_error=critical,
        filter=critical is not None or not success,
        error=None if error is None else f"{error.type}: {error.message}",
        timing=ProRLTiming(
            init_time=result.timing.init_s,
            run_time=result.timing.run_s,
            eval_time=result.timing.eval_s,
            others_time=max(0.0, result.timing.total_s - in_stages),
            counted_elapsed=in_stages,
            timeout_triggered=result.state == "timeout",
        ),
        job_id=result.job_id,
        state=result.state,
        stage_failed=result.stage_failed,
        error_kind=None if error is None else error.kind,
        attempts=result.attempts,
        data_source=result.data_source,
        task=result.task,
        metrics={**result.metrics, "prorl": call.record()},
    )
