"""Real HTTP servers speaking each inference protocol, driven by a scripted 'model'.

The model is deterministic: the i-th generated token of a prompt is (sum(prompt) + i) % 1000 + 3,
its logprob -0.01 * (i + 1); token 2 is EOS, emitted when the prompt asks for it via a stop id.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse


def _server_app(model: str) -> FastAPI:
    """An app with an inference server's health and model list, for the routes to go on."""
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model, "object": "model"}]}

    return app


def scripted(
    prompt: list[int], max_tokens: int, stop: list[int]
) -> tuple[list[int], list[float], str]:
    tokens, logprobs = [], []
    for i in range(max_tokens):
        token = (sum(prompt) + i) % 1000 + 3
        if 2 in stop and i == 2:
            token = 2  # "EOS" after three tokens when the caller stops on it
        tokens.append(token)
        logprobs.append(-0.01 * (i + 1))
        if token in stop:
            return tokens, logprobs, "stop"
    return tokens, logprobs, "length"


Forge = Callable[[list[int], list[float]], tuple[list[Any], list[Any]]]


def _raw_json(data: dict[str, Any]) -> Response:
    """``data`` as Python's json writes it: NaN and Infinity as those words, as a server that
    does not check its numbers sends them (FastAPI's own encoder refuses them)."""
    return Response(json.dumps(data), media_type="application/json")


class FakeBackend:
    """One fake server: records the requests it got, can be told to fail, or to answer what
    ``forge(ids, logprobs)`` makes of the scripted answer (a NaN, an id too many...)."""

    def __init__(self, protocol: str, old_vllm: bool = False) -> None:
        self.protocol = protocol
        self.requests: list[dict[str, Any]] = []
        self.fail_with: int | None = None
        self.fail_times = -1  # with fail_with: how many requests fail (negative: all)
        self.forge: Forge | None = None
        # What SGLang's meta_info says of the weights (left out where None): its version, a
        # string, and the spans [{version, start, end}] of the newer SGLangs.
        self.weight_version: Any = None
        self.weight_versions: Any = None
        # A vLLM that streams when asked (a chunk per token, then a usage chunk where asked),
        # and, with hold_after, one that stops after that many tokens until released (0: none
        # at all, a stalled server); ``holding`` is set once one waits. ``stream_error``: an
        # error event sent instead of the rest; ``cut``: the stream ends without [DONE].
        self.streams = False
        self.hold_after: int | None = None
        self.holding = threading.Event()
        self.released = threading.Event()
        self.stream_error: dict[str, Any] | None = None
        self.cut = False
        # A broken server: tokens beyond max_tokens in its stream, or an event with no end.
        self.extra_tokens = 0
        self.endless_event = False
        app = self.app = _server_app("fake-model")

        def scripted_answer(
            prompt: list[int], max_tokens: int, stop: list[int]
        ) -> tuple[list[Any], list[Any], str]:
            ids, lps, finish = scripted(prompt, max_tokens, stop)
            if self.forge is not None:
                forged_ids, forged_lps = self.forge(ids, lps)
                return forged_ids, forged_lps, finish
            return ids, lps, finish

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            self.requests.append(body)
            if self.fail_with and self.fail_times != 0:
                self.fail_times -= 1
                return _error(self.fail_with, {"Retry-After": "0"})
            ids, lps, finish = scripted_answer(
                body["prompt"], body["max_tokens"], body.get("stop_token_ids", [])
            )
            choice: dict[str, Any] = {
                "index": 0,
                "text": "",
                "logprobs": {
                    "token_logprobs": lps,
                    "tokens": [f"token_id:{t}" for t in ids],
                    "top_logprobs": None,
                    "text_offset": [],
                },
                "finish_reason": finish,
                "stop_reason": None,
            }
            if not old_vllm:
                choice["token_ids"] = ids
                choice["prompt_token_ids"] = body["prompt"]
            if body.get("stream") and self.streams:
                usage = (body.get("stream_options") or {}).get("include_usage", False)
                return StreamingResponse(
                    self._events(ids, lps, finish, usage, old_vllm), media_type="text/event-stream"
                )
            return _raw_json(
                {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "choices": [choice],
                    "usage": {
                        "prompt_tokens": len(body["prompt"]),
                        "completion_tokens": len(ids),
                        "prompt_tokens_details": {"cached_tokens": 0},
                    },
                }
            )

        @app.post("/generate")
        async def generate(request: Request) -> Any:
            body = await request.json()
            self.requests.append(body)
            if self.fail_with:
                return _error(self.fail_with)
            if self.protocol == "sglang":
                sp = body["sampling_params"]
                ids, lps, finish = scripted_answer(
                    body["input_ids"], sp["max_new_tokens"], sp.get("stop_token_ids", [])
                )
                meta: dict[str, Any] = {
                    "finish_reason": {"type": finish},
                    # As SGLang: (logprob, id, text); a forged answer may have more ids than
                    # logprobs, so the entries follow the logprobs.
                    "output_token_logprobs": [
                        [lp, t, None] for lp, t in zip(lps, ids, strict=False)
                    ],
                    "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": len(ids),
                    "cached_tokens": 0,
                }
                for key in ("weight_version", "weight_versions"):
                    if getattr(self, key) is not None:
                        meta[key] = getattr(self, key)
                return _raw_json({"text": "", "output_ids": ids, "meta_info": meta})
            ids, lps, _ = scripted_answer(
                body["prompt_ids"], body["max_tokens"], body.get("stop_token_ids", [])
            )
            return _raw_json({"response_ids": ids, "logprobs": lps})

    async def _events(
        self, ids: list[Any], lps: list[Any], finish: str, usage: bool, old_vllm: bool
    ) -> AsyncIterator[bytes]:
        """vLLM's stream of a scripted answer: a chunk per token, the finish on the last."""
        if self.endless_event:
            for _ in range(64):
                yield b"data: " + b"x" * 1024  # never a newline
            return
        ids, lps = ids + [7] * self.extra_tokens, lps + [-0.1] * self.extra_tokens
        for i, (token, logprob) in enumerate(zip(ids, lps, strict=False)):
            if i == self.hold_after:
                self.holding.set()
                await asyncio.to_thread(self.released.wait, AgentBackend.HOLD_S)
            if i == 1 and self.stream_error is not None:
                yield _event({"error": self.stream_error})
                break
            choice: dict[str, Any] = {
                "index": 0,
                "text": "",
                "logprobs": {"token_logprobs": [logprob], "tokens": [f"token_id:{token}"]},
                "finish_reason": finish if i == len(ids) - 1 else None,
            }
            if not old_vllm:
                choice["token_ids"] = [token]
            yield _event({"id": "cmpl-1", "object": "text_completion", "choices": [choice]})
        if self.cut:
            return
        if usage:
            counts = {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}
            yield _event({"id": "cmpl-1", "choices": [], "usage": counts})
        yield b"data: [DONE]\n\n"


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _error(status: int, headers: dict[str, str] | None = None) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": "told to fail"}, status_code=status, headers=headers)


class ServerThread:
    """uvicorn in a thread on a free loopback port; stop() makes the address refuse connections."""

    def __init__(self, app: FastAPI) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class AgentBackend:
    """A vLLM-protocol server whose 'model' acts: ``script(prompt_text)`` says what to answer.

    The answer is encoded with the tiny model's tokenizer (SmolLM2's) and ends with its
    end-of-turn token, so raas parses real tool calls out of real token ids. ``latency_s``
    keeps jobs in flight long enough for a test to break something under them. Each token's
    logprob is -0.1, or ``logprob(position, token)``; ``returned`` keeps every answer as
    (prompt ids, token ids, logprobs), what a test compares a recorded trajectory with.
    ``forge(prompt_text)``, where given, says what to make of an answer to that prompt (a
    Forge of its ids and logprobs, or None to leave it), as a broken server would answer.
    ``weight_version``, where set, is answered as raas's engine does (the version of the weights
    that generated every token), where vLLM says nothing.
    """

    HOLD_S = 600.0  # a test that never releases a held request is stopped by its own deadline

    def __init__(
        self,
        script: Callable[[str], str],
        latency_s: float = 0.0,
        hold: Callable[[str], bool] | None = None,
        logprob: Callable[[int, int], float] | None = None,
        forge: Callable[[str], Forge | None] | None = None,
    ) -> None:
        """``hold(prompt_text)`` true: that request is answered only after release() (a job
        that stays in flight); ``holding`` is set once one waits. ``logprob(position, token)``:
        each token's logprob (-0.1 by default)."""
        from raas.llm.chat import encode
        from raas.llm.models import load_tokenizer

        tok = load_tokenizer("tiny")
        self.calls = 0
        self.holding = threading.Event()
        self._released = threading.Event()
        self.returned: list[tuple[list[int], list[int], list[float]]] = []
        self.weight_version: int | None = None
        app = self.app = _server_app("agent")

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            body = await request.json()
            self.calls += 1
            await asyncio.sleep(latency_s)
            prompt = tok.decode(body["prompt"])
            if hold is not None and hold(prompt):
                self.holding.set()
                await asyncio.to_thread(self._released.wait, self.HOLD_S)
            ids = encode(tok, script(prompt)) + [tok.eos_token_id]
            finish = "stop"
            limit = body.get("max_tokens")
            if isinstance(limit, int) and len(ids) > limit:  # as a real server: cut, "length"
                ids, finish = ids[:limit], "length"
            logprobs = [logprob(i, t) if logprob else -0.1 for i, t in enumerate(ids)]
            forged = forge(prompt) if forge is not None else None
            if forged is not None:
                ids, logprobs = forged(ids, logprobs)
            self.returned.append((list(body["prompt"]), ids, logprobs))
            answer: dict[str, Any] = {
                "id": "cmpl-agent",
                "object": "text_completion",
                "choices": [
                    {
                        "index": 0,
                        "text": "",
                        "token_ids": ids,
                        "logprobs": {"token_logprobs": logprobs},
                        "finish_reason": finish,
                    }
                ],
                "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(ids)},
            }
            version = self.weight_version
            if version is not None:
                answer["weight_version"] = version
                answer["weight_versions"] = [{"version": version, "start": 0, "end": len(ids)}]
            return _raw_json(answer)

    def release(self) -> None:
        """Answer the held requests (and any later ones) at once."""
        self._released.set()
