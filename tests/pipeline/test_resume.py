"""Durable turns in the fault tier (make test-faults): `raas serve` SIGKILLed while a job waits
for its third model call, restarted on the same database; the job goes on from its last durable
turn (raas.agent.checkpoints).

The model is a vLLM-protocol server whose answers are scripted by the turn (how many answers the
prompt holds): turn 0 makes files, a directory and a variable; turn 1 changes and removes files
and starts a background process; turn 2 (held the first time, while the server is killed) prints
what the sandbox holds; turn 3 writes the solution; turn 4 finishes. The server counts each
turn's requests. A job that runs uninterrupted on the same script is the control: a resumed job's
trajectory (every token, mask and logprob) and reward must be the same as its.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.store.checkpoints import root_of
from tests.pipeline.test_faults import PROBLEMS, SOLUTIONS, STEP, result, wait_until
from tests.support.llm_servers import AgentBackend, ServerThread
from tests.support.policies import call

pytestmark = pytest.mark.faults

PROBLEM = PROBLEMS[0]
HELD_TURN = 2  # the turn whose model call is held while the server is killed


class Model:
    """The scripted model, counting the requests of each turn; the first request of HELD_TURN
    waits until ``backend.release()``."""

    def __init__(self) -> None:
        self.requests: Counter[int] = Counter()
        self.held = False

    def turn(self, prompt: str) -> int:
        return prompt.count(STEP)

    def hold(self, prompt: str) -> bool:
        turn = self.turn(prompt)
        self.requests[turn] += 1
        if turn == HELD_TURN and not self.held:
            self.held = True
            return True
        return False

    def script(self, prompt: str) -> str:
        turn = self.turn(prompt)
        if turn == 0:
            command = (
                "mkdir -p /workspace/d && cd /workspace/d && printf 'one\\n' > f"
                " && echo junk > gone && mkdir empty && export MARK='kept it'"
            )
            return f"{STEP} {call('bash', command=command)}"
        if turn == 1:
            command = "echo two >> f && rm gone && (sleep 300 >/dev/null 2>&1 &)"
            return f"{STEP} {call('bash', command=command)}"
        if turn == 2:
            command = 'pwd; echo "mark=$MARK"; cat f; ls -A1'
            return f"{STEP} {call('bash', command=command)}"
        if turn == 3:
            lines = len(PROBLEM["prompt"].splitlines())
            write = call(
                "editor",
                command="insert",
                path="/workspace/solution.py",
                insert_line=lines,
                new_str=SOLUTIONS[PROBLEM["instance_id"]],
            )
            return f"{STEP} {write}"
        return f"{STEP} {call('finish', message='done')}"


def start_model() -> tuple[Model, AgentBackend, ServerThread]:
    model = Model()
    agent = AgentBackend(model.script, 0.05, hold=model.hold)
    return model, agent, ServerThread(agent.app).start()


def submit(url: str, job_id: str) -> None:
    r = httpx.post(f"{url}/v1/rollouts", json={"instance": PROBLEM, "job_id": job_id})
    assert r.status_code == 202, r.text


def rows(db: Path) -> list[tuple[int, str | None, dict[str, Any]]]:
    """The checkpoint rows in the database: (turn, archive, data)."""
    with sqlite3.connect(db) as conn:
        found = conn.execute("SELECT turn, archive, data FROM checkpoints ORDER BY turn")
        return [(turn, archive, json.loads(data)) for turn, archive, data in found]


def killed_at_held_turn(svc: Any, agent: AgentBackend, job_id: str) -> None:
    """Submit ``job_id``, wait for its held model call and for both turns before it to be
    durable, then SIGKILL the server and let the model answer again."""
    submit(svc.url, job_id)
    wait_until(agent.holding.is_set, "the held turn's model call")
    wait_until(lambda: len(rows(svc.db)) == HELD_TURN, "two durable turns")
    svc.kill()
    agent.release()


def control(svc: Any) -> dict[str, Any]:
    """An uninterrupted job of the same script, after the others."""
    submit(svc.url, "control")
    return result(svc.url, "control")


def same_rollout(resumed: dict[str, Any], uninterrupted: dict[str, Any]) -> None:
    a, b = resumed["trajectory"], uninterrupted["trajectory"]
    for name in ("prompt_ids", "response_ids", "loss_mask", "logprobs"):
        assert a[name] == b[name], name
    assert _without_ids(a["messages"]) == _without_ids(b["messages"])
    assert [t["text"] for t in a["turns"]] == [t["text"] for t in b["turns"]]
    assert resumed["reward"] == uninterrupted["reward"] == 1.0


def _without_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages but for their tool call ids (random per job; the model never sees them)."""
    return [{k: v for k, v in m.items() if k != "tool_call_id"} for m in messages]


def observation(res: dict[str, Any], turn: int) -> str:
    """What the tool answered at ``turn`` (its messages: system, user, then per turn an
    assistant message and one tool message)."""
    tools = [m for m in res["trajectory"]["messages"] if m["role"] == "tool"]
    return str(tools[turn]["content"])


def test_a_job_killed_after_turn_k_resumes_at_k_plus_1_with_its_tokens_and_files(
    service: Any,
) -> None:
    model, agent, llm = start_model()
    try:
        svc = service([llm.url])
        killed_at_held_turn(svc, agent, "resumed")
        before = {turn: n for turn, n in model.requests.items()}
        assert before == {0: 1, 1: 1, 2: 1}

        svc.start()
        res = result(svc.url, "resumed")
        resume = res["resume"]
        assert (resume["resumed_at_turn"], resume["refused"]) == (HELD_TURN, None)
        # The background process did not come back, and the result says so.
        assert any("sleep" in lost for lost in resume["lost"]), resume
        # Turns 0 and 1 were never generated again; the turn in flight at the kill was.
        assert model.requests == Counter({0: 1, 1: 1, 2: 2, 3: 1, 4: 1})
        assert res["attempts"] == 2 and res["attempt_errors"][0]["type"] == "server_restart"
        # The sandbox as turn 1 left it: directory, variable, files changed and removed.
        seen = observation(res, HELD_TURN)
        assert "/workspace/d\nmark=kept it\none\ntwo\nempty\nf" in seen.replace("\r", "")
        checkpoints = res["metrics"]["checkpoints"]
        assert checkpoints["written"] >= 2 and checkpoints["stopped"] is None

        same_rollout(res, control(svc))
        # Kept only while a job is in flight: gone with its result.
        assert rows(svc.db) == []
        assert list(root_of(svc.db).iterdir()) == []
        svc.stop()
        svc.assert_nothing_left()
    finally:
        agent.release()
        llm.stop()


def test_a_changed_setting_makes_the_job_start_over_and_says_why(
    service: Any,
) -> None:
    model, agent, llm = start_model()
    try:
        svc = service([llm.url])
        killed_at_held_turn(svc, agent, "changed")
        # As if the job's checkpoints were made under other sampling params than it has now.
        with sqlite3.connect(svc.db) as conn:
            conn.execute(
                "UPDATE checkpoints SET data = json_set(data, '$.fingerprint.sampling_params',"
                " 'another')"
            )
        svc.start()
        res = result(svc.url, "changed")
        assert res["resume"]["resumed_at_turn"] is None
        assert "sampling_params" in res["resume"]["refused"]
        assert model.requests[0] == 2  # from the start
        same_rollout(res, control(svc))
        svc.stop()
    finally:
        agent.release()
        llm.stop()


def test_a_checkpoint_half_written_at_the_kill_is_ignored(service: Any) -> None:
    model, agent, llm = start_model()
    try:
        svc = service([llm.url])
        killed_at_held_turn(svc, agent, "torn")
        (_, _, _), (turn, archive, data) = rows(svc.db)
        assert turn == HELD_TURN and archive is not None
        # The last archive torn, as a crash mid-write leaves one; and a stray file with no row.
        (job_dir,) = root_of(svc.db).iterdir()
        torn = job_dir / archive
        torn.write_bytes(torn.read_bytes()[: data["size"] // 2])
        (job_dir / "turn-3-unfinished.tar").write_bytes(b"half")
        svc.start()
        res = result(svc.url, "torn")
        assert res["resume"]["resumed_at_turn"] == HELD_TURN - 1
        assert model.requests[0] == 1 and model.requests[1] == 2  # only turn 1 again
        same_rollout(res, control(svc))
        svc.stop()
    finally:
        agent.release()
        llm.stop()
