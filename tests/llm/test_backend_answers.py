"""A backend that answers garbage (issue 33): a NaN or infinite logprob, more tokens than asked
for, an id outside the vocabulary. The job fails as infra, naming the backend and what was
wrong, and the trainer's feed and the export go on holding every job (before, a NaN logprob
ended the job `done` with reward 1.0 and a row that made every page holding it fail)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from raas.api.app import create_app
from raas.settings import ServeSettings
from raas.store.export import export
from tests.support.llm_servers import AgentBackend, Forge, ServerThread
from tests.support.policies import call

FINE = {"data_source": "math", "problem": "What is 2 + 2?", "answer": "4"}
BROKEN = {"data_source": "math", "problem": "What is 3 + 3?", "answer": "6"}
TINY_VOCAB = 49152  # SmolLM2's tokenizer, the server's here ("tiny")
FORGERIES: dict[str, tuple[Forge, str]] = {
    "nan": (lambda ids, lps: (ids, [float("nan"), *lps[1:]]), "logprob nan at position 0"),
    "infinity": (lambda ids, lps: (ids, [*lps[:-1], float("inf")]), "logprob inf at position"),
    "over-long": (
        lambda ids, lps: ((ids * 20001)[:20001], (lps * 20001)[:20001]),
        "returned 20001 tokens where at most",
    ),
    "out of vocabulary": (
        lambda ids, lps: ([TINY_VOCAB, *ids[1:]], lps),
        f"token id {TINY_VOCAB} at position 0, outside the vocabulary",
    ),
}


def answer(prompt: str) -> str:
    return call("finish", answer="6" if "3 + 3" in prompt else "4")


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Any]:
    """``service(forgery)``: a server whose backend answers the BROKEN problem forged so, and
    (its URL, the backend's, its database)."""
    threads: list[ServerThread] = []

    def start(forgery: str) -> tuple[str, str, Path]:
        forged, _ = FORGERIES[forgery]
        fake = AgentBackend(answer, forge=lambda prompt: forged if "3 + 3" in prompt else None)
        backend = ServerThread(fake.app).start()
        threads.append(backend)
        db = tmp_path / "raas.db"
        settings = ServeSettings(db=db, llm=[backend.url], tokenizer="tiny", max_attempts=2)
        threads.append(ServerThread(create_app(settings)).start())
        return threads[-1].url, backend.url, db

    yield start
    for thread in reversed(threads):
        thread.stop()


def finished(url: str, job_id: str) -> dict[str, Any]:
    got = httpx.get(f"{url}/v1/rollouts/{job_id}", params={"wait": 60}, timeout=70).json()
    assert got["result"] is not None, got
    return got["result"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forged_answer_fails_its_job_as_infra_and_the_feed_goes_on(
    service: Any, forgery: str, tmp_path: Path
) -> None:
    url, backend, db = service(forgery)
    jobs = [{"instance": FINE, "job_id": "fine"}, {"instance": BROKEN, "job_id": "broken"}]
    assert httpx.post(f"{url}/v1/rollouts:batch", json={"jobs": jobs}).status_code == 202
    assert finished(url, "fine")["reward"] == 1.0
    broken = finished(url, "broken")
    error = broken["error"]
    assert (broken["state"], broken["reward"], error["kind"]) == ("failed", None, "infra")
    assert error["type"] == "BackendError" and error["message"].startswith(f"{backend}: ")
    assert FORGERIES[forgery][1] in error["message"]
    assert broken["attempts"] == 2  # infra: run again, and the backend answered the same
    assert broken["trajectory"]["logprobs"] == []  # nothing of the forged answer was taken

    page = httpx.get(f"{url}/v1/rollouts").json()
    assert sorted(r["job_id"] for r in page["results"]) == ["broken", "fine"]
    assert export(db, "jsonl", tmp_path / "out.jsonl") == 2
