"""The fuzz tier (make test-fuzz): schemathesis, every phase, against a real server and its own
/openapi.json, as a tester would fuzz it; any 5xx, any answer the document does not describe
(an undocumented status, a body against its schema, a valid request refused, an invalid one
taken) fails.

Four runs: a ``raas serve`` without an API key and one with a key, with a fixed seed each; the
gateway's routes with a job's own token (a server in this process, where a test can open a
gateway session as a job does); and the keyless server again with a random seed, which is
printed (``RAAS_FUZZ_SEED=N make test-fuzz`` replays it). ``RAAS_FUZZ_SECONDS`` is each run's
time budget (default 60).

POST /stop is left out: it drains the server by design (ProRL's clients call it; behind the
API key where there is one), after which every submission is a documented 503 and the rest of
a run would fuzz a server that refuses work; tests/api/test_api.py and test_prorl_contract.py test
it. Answers may take up to 300 s (POST /process blocks until its job is done).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from raas.api.app import create_app
from raas.launch import ServerProcess
from raas.llm.types import SamplingParams
from raas.settings import ServeSettings
from raas.wire import Trajectory
from tests.support.llm_servers import ServerThread
from tests.support.tiers import selected

pytestmark = pytest.mark.fuzz

SEED = 20261126
SECONDS = int(os.environ.get("RAAS_FUZZ_SECONDS", "60"))
KEY = "fuzz-key"
GATEWAY = (
    r"^(/v1/(models|chat/completions|responses|messages|messages/count_tokens)"
    r"|/v1beta/models/\{model\}:(generateContent|streamGenerateContent|countTokens))$"
)
# A job's budget is short and the INIT queue small (a full one is a documented 429), so a fuzzed
# POST /process, which answers once its job is done, does so within the run.
SERVE_ARGS = ["--timeout-s", "10", "--init-queue", "32"]


def schemathesis() -> str:
    """The schemathesis CLI: this Python's environment's (make test-fuzz installs it), or
    ``RAAS_FUZZ_CLI``'s (one installed elsewhere)."""
    cli = os.environ.get("RAAS_FUZZ_CLI") or str(Path(sys.executable).parent / "st")
    if not Path(cli).exists():  # as tests.support.tiers.require: asked for by its marker, a failure
        why = f"the fuzz tier needs schemathesis ({cli}): `make test-fuzz` installs it"
        if selected("fuzz"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return cli


CONFIG = Path(__file__).with_name("schemathesis.toml")


def fuzz(url: str, seed: int, *args: str, document: Path | None = None) -> None:
    """Run schemathesis on ``url``'s document (or ``document``, a copy of it); fail with its
    report if it found anything."""
    argv = [
        schemathesis(),
        f"--config-file={CONFIG}",
        "run",
        *([str(document), f"--url={url}"] if document else [f"{url}/openapi.json"]),
        "--phases=examples,coverage,fuzzing,stateful",
        "--checks=all",
        # POST /process answers when its job is done (the server's --timeout-s inside stages,
        # after its queue waits): slow by design, which is no breach of the document.
        "--max-response-time=300",
        "--request-timeout=300",
        f"--seed={seed}",
        f"--max-time={SECONDS}",
        "--workers=2",
        "--exclude-path=/stop",
        *args,
    ]
    print(f"fuzzing {url} with seed {seed}: {' '.join(argv)}", flush=True)
    # In a scratch directory: schemathesis keeps its own state in .schemathesis/ there.
    run = subprocess.run(
        argv, capture_output=True, text=True, timeout=SECONDS + 300, cwd=tempfile.mkdtemp()
    )
    report = run.stdout + run.stderr
    summary = report[report.find("SUMMARY") :] if "SUMMARY" in report else report[-3000:]
    print(summary, flush=True)
    assert run.returncode == 0, f"seed {seed}:\n{report[-20000:]}"


def serve(tmp_path: Path, key: str | None) -> Iterator[ServerProcess]:
    """``raas serve`` on a fresh database, with ``key`` as its API key (RAAS_API_KEY) or none."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_API_KEY")}
    if key is not None:
        env["RAAS_API_KEY"] = key
    server = ServerProcess(tmp_path / "fuzz.db", tmp_path / "serve.log", SERVE_ARGS, env)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
def keyless(tmp_path: Path) -> Iterator[ServerProcess]:
    yield from serve(tmp_path, None)


@pytest.fixture
def keyed(tmp_path: Path) -> Iterator[ServerProcess]:
    yield from serve(tmp_path, KEY)


def test_a_server_without_a_key_keeps_its_document(keyless: ServerProcess) -> None:
    fuzz(keyless.url, SEED)


def test_a_server_with_a_key_keeps_its_document(keyed: ServerProcess) -> None:
    # The key opens everything; ignored_auth also sends requests without it (they must be 401s).
    fuzz(keyed.url, SEED, f"--header=Authorization: Bearer {KEY}")


def test_the_gateway_with_a_job_token_keeps_its_document(tmp_path: Path) -> None:
    app = create_app(ServeSettings(db=tmp_path / "gw.db", tokenizer="tiny", api_key=KEY))
    server = ServerThread(app).start()
    try:
        # As a job's agent gets it: a token that opens the gateway's routes and nothing else
        # (the document too is the server key's).
        session = app.state.service.gateway.open(
            "fuzz", SamplingParams(max_tokens=16), Trajectory()
        )
        document = tmp_path / "openapi.json"
        auth = {"Authorization": f"Bearer {KEY}"}
        document.write_bytes(httpx.get(f"{server.url}/openapi.json", headers=auth).content)
        fuzz(
            server.url,
            SEED,
            f"--header=Authorization: Bearer {session.token}",
            f"--include-path-regex={GATEWAY}",
            # The gateway reads OpenAI's request bodies (OpenAI documents them; raas's document
            # does not): an empty body is a 400, as OpenAI's. Its statuses and error shapes are
            # checked.
            "--exclude-checks=positive_data_acceptance",
            document=document,
        )
    finally:
        server.stop()


def test_a_random_seed_finds_nothing_either(keyless: ServerProcess) -> None:
    seed = int(os.environ.get("RAAS_FUZZ_SEED") or random.randrange(2**31))
    print(f"random fuzzing seed: {seed} (replay: RAAS_FUZZ_SEED={seed} make test-fuzz)")
    fuzz(keyless.url, seed)
