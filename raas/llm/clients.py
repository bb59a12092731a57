"""Token-in/token-out clients: one interface, one class per server protocol.

Every client sends the prompt as token ids and returns the generated token ids with one logprob
per token, so a trajectory never passes through text. Field names follow each server's own
protocol: vLLM's OpenAI-compatible ``/v1/completions`` (``return_token_ids``, vLLM >= 0.10.2;
older servers via ``return_tokens_as_token_ids``), SGLang's native ``/generate`` (``input_ids``,
``return_logprob``), and the verl/ProRL-style ``/generate`` (``prompt_ids`` -> ``response_ids``).
Where the server says which weights generated the tokens (SGLang's ``meta_info``, raas's engine),
the generation carries each token's version; vLLM's and verl's answers say nothing of it.

Around a weight sync the pool pauses each server through its own routes (:meth:`LLMClient.pause`):
vLLM's ``POST /pause?mode=`` and ``POST /resume`` (its development routes,
``VLLM_SERVER_DEV_MODE=1``; raas's engine serves them too), SGLang's ``POST /pause_generation``
``{"mode"}`` and ``POST /continue_generation``. A server without them (a 404, or verl's
``/generate``) is drained by the pool instead. A generation that a server ended with
``finish_reason`` ``abort`` comes back as it stands (the tokens so far), for the pool to resume
from that prefix.

The HTTP client is aiohttp on keep-alive connections: every agent turn makes one request, and
httpx's connection-pool bookkeeping cost about 1.4 ms of CPU a request at 16 in flight, against
0.13 ms for aiohttp (`raas bench scale` measures the whole turn).
"""

from __future__ import annotations

import dataclasses
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

import aiohttp
import orjson

from raas.helpers.retries import retry_after_s
from raas.llm.types import STALL_TIMEOUT_S, BackendError, Generation, LiveCall, SamplingParams
from raas.llm.validation import answer_problem


def base_url(address: str) -> str:
    """``http://host:8000/v1`` and ``http://host:8000/`` both mean the server at host:8000."""
    url = address.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    return url[: -len("/v1")] if url.endswith("/v1") else url


# As httpx's default: at most this many connections to one backend, the rest wait for one.
MAX_CONNECTIONS = 100
CONNECT_TIMEOUT_S = 5.0
HEALTH_TIMEOUT_S = 5.0
MODELS_TIMEOUT_S = 10.0
# The longest event of a stream raas reads (a whole answer of 32k tokens in one event is about
# 2 MiB): more is a broken server, not one to hold in memory.
MAX_EVENT_BYTES = 16 * 2**20
# A pause answers once the server is paused: after its current step, or once the generations in
# flight have ended (an "abort"); never a whole generation's time.
CONTROL_TIMEOUT_S = 120.0
_JSON = {"Content-Type": "application/json"}
# What a request to a backend can raise that is the connection's fault, not the answer's: worth
# retrying (aiohttp's timeouts are ClientErrors too; asyncio's TimeoutError covers the rest).
TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError)


@dataclasses.dataclass(frozen=True)
class Answer:
    """A backend's HTTP answer, read whole."""

    status: int
    headers: Mapping[str, str]  # case-insensitive (aiohttp's)
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def _loads(body: bytes) -> Any:
    """JSON as the stdlib reads it (NaN, Infinity and big ints too), at orjson's speed."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)


# How the pool pauses servers around a weight sync: "keep" freezes (or requeues) the
# generations in flight, which go on under the new weights; "abort" ends them with the tokens so
# far, and the pool resumes each from that prefix once the servers resume.
PauseMode = Literal["keep", "abort"]


def policy_versions(answer: Mapping[str, Any], generated: int) -> list[int] | None:
    """The weight version of each of ``generated`` tokens, from the fields SGLang puts in its
    ``/generate`` ``meta_info`` and raas's engine in its completion response: ``weight_versions``,
    spans ``{version, start, end}`` over the generated tokens (an update mid-generation starts a
    new one), else ``weight_version`` alone (an SGLang without spans: the version when the
    generation finished, said of every token). None where there is neither, or a version that is
    no integer (SGLang's "default" before any update names one). Spans that do not cover the
    tokens once each are a ValueError."""
    spans = answer.get("weight_versions")
    if spans is None:
        version = _version(answer.get("weight_version"))
        return None if version is None else [version] * generated
    versions: list[int] = []
    for span in spans:
        start, end = span["start"], span["end"]
        if start != len(versions) or not start <= end <= generated:
            raise ValueError(f"weight_versions spans do not cover the {generated} tokens: {spans}")
        version = _version(span["version"])
        if version is None:
            return None
        versions += [version] * (end - start)
    if len(versions) != generated:
        raise ValueError(f"weight_versions spans do not cover the {generated} tokens: {spans}")
    return versions


def _version(value: Any) -> int | None:
    """A version raas can order: an integer, or a string of one (SGLang's are strings)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdecimal():
        return int(value)
    return None


class LLMClient(ABC):
    protocol: ClassVar[str]

    def __init__(
        self,
        address: str,
        model: str | None = None,
        timeout_s: float = 600.0,
        stall_timeout_s: float = STALL_TIMEOUT_S,
        stream: bool = True,
    ) -> None:
        self.url = base_url(address)
        self.model = model
        self.timeout_s = timeout_s
        self.stall_timeout_s = stall_timeout_s
        # Ask for a stream where the protocol has one (vLLM's): tokens counted as they come,
        # a stall told from a slow model; it costs the client about 10x the CPU a token.
        self.stream = stream
        # Whether the server streams when asked: None until its first answer says. One that
        # answers whole is then read under the whole generation's timeout, not the stall's.
        self.streams: bool | None = None
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        # Made on first use, on the event loop that uses it (a session belongs to one loop).
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS),
                # A read may take as long as a generation, and so may waiting for a free
                # connection (``connect``); opening one may not.
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=self.timeout_s,
                    sock_connect=CONNECT_TIMEOUT_S,
                    sock_read=self.timeout_s,
                ),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _send(
        self, method: str, path: str, body: bytes | None = None, timeout_s: float | None = None
    ) -> Answer:
        """One request; a connection that fails or times out raises a transport error."""
        extra: dict[str, Any] = {}
        if timeout_s is not None:  # (aiohttp reads timeout=None as no limit at all)
            extra["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
        if body is not None:
            extra["headers"] = _JSON
        async with self._http().request(method, self.url + path, data=body, **extra) as response:
            return Answer(response.status, response.headers, await response.read())

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            # orjson: a prompt of thousands of token ids goes out on every turn (json.dumps
            # takes ~15x longer on such a list).
            response = await self._send("POST", path, orjson.dumps(body))
        except TRANSPORT_ERRORS as e:
            raise BackendError(self.url, f"{type(e).__name__}: {e}", transient=True) from e
        self._check(response.status, response.headers, response.text)
        return self._json(response.body)

    def _check(self, status: int, headers: Mapping[str, str], text: str) -> None:
        """An answer's status as a BackendError: 5xx and 429 worth retrying, another 4xx not."""
        if status >= 500 or status == 429:
            raise BackendError(
                self.url, f"HTTP {status}: {text[:300]}", retry_after_s=retry_after_s(headers)
            )
        if status >= 400:
            raise BackendError(self.url, f"HTTP {status}: {text[:500]}", transient=False)

    def _json(self, body: bytes) -> dict[str, Any]:
        try:
            data: dict[str, Any] = _loads(body)
        except ValueError as e:
            text = body.decode("utf-8", "replace")
            raise BackendError(self.url, f"answered with no JSON: {text[:200]}") from e
        return data

    async def _post_stream(
        self,
        path: str,
        body: dict[str, Any],
        on_event: Callable[[dict[str, Any]], int],
        live: LiveCall | None = None,
    ) -> dict[str, Any] | None:
        """POST a request that asks for a stream (server-sent events, each ``data: {json}``, the
        last ``data: [DONE]``): ``on_event`` is given each event as it comes (and says how many
        tokens it brought), and None returned at the end. A server that answered whole instead
        (it does not stream) gives its JSON answer back. No token for ``stall_timeout_s``
        (before the first or between two) is a transient BackendError that says the backend
        stalled, whether it sent nothing or went on sending what brings no token (comments,
        empty events: a stream that never ends would hold its caller forever); so is a stream
        cut short."""
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self.timeout_s,
            sock_connect=CONNECT_TIMEOUT_S,
            sock_read=self.stall_timeout_s if self.streams is not False else self.timeout_s,
        )
        done = False
        try:
            async with self._http().post(
                self.url + path, data=orjson.dumps(body), headers=_JSON, timeout=timeout
            ) as response:
                if response.status >= 400 or not response.content_type.startswith(
                    "text/event-stream"
                ):
                    answer = await response.read()
                    if response.status >= 400:
                        text = answer.decode("utf-8", "replace")
                        self._check(response.status, response.headers, text)
                    self.streams = False
                    return self._json(answer)
                self.streams = True
                if live is not None:
                    live.streaming = True
                # Read as it arrives and split here: a line at a time (aiohttp's readline) cost
                # about twice the CPU on a stream of a chunk a token.
                rest = b""
                last_token = time.monotonic()
                async for block in response.content.iter_any():
                    lines = (rest + block).split(b"\n")
                    rest = lines.pop()  # a line not whole yet
                    if len(rest) > MAX_EVENT_BYTES:  # a server that never ends its line
                        raise BackendError(
                            self.url, f"a stream event longer than {MAX_EVENT_BYTES} bytes", False
                        )
                    for line in lines:
                        if not line.startswith(b"data:"):
                            continue  # blank lines between events, comments, other fields
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            done = True
                            break
                        if on_event(self._event(data)):
                            last_token = time.monotonic()
                    if done:
                        break
                    if time.monotonic() - last_token > self.stall_timeout_s:
                        raise TimeoutError  # bytes, but no token: stalled as much as silence
        except TimeoutError as e:  # (aiohttp's read timeout is one too)
            raise BackendError(
                self.url, f"stalled: sent nothing for {self.stall_timeout_s:g} s"
            ) from e
        except aiohttp.ClientError as e:
            raise BackendError(self.url, f"{type(e).__name__}: {e}") from e
        if not done:
            raise BackendError(self.url, "the stream ended before its [DONE]")
        return None

    def _event(self, data: bytes) -> dict[str, Any]:
        """One event of a stream; an error the server sends in the stream (vLLM's
        ``{"error": {...}}``, or its older ``{"object": "error", ...}``) is a BackendError."""
        event = self._json(data)
        error = event.get("error") if isinstance(event, dict) else None
        if isinstance(event, dict) and event.get("object") == "error":
            error = event
        if error is not None:
            code = error.get("code") if isinstance(error, dict) else None
            message = error.get("message") if isinstance(error, dict) else error
            transient = isinstance(code, int) and (code >= 500 or code == 429)
            raise BackendError(self.url, f"error in its stream: {message}", transient)
        return event

    async def health(self) -> str | None:
        """None when the server answers its health route (a server without one counts if up),
        else why not, said so that a person can act on it (the pool reports it as the cause)."""
        try:
            response = await self._send("GET", "/health", timeout_s=HEALTH_TIMEOUT_S)
        except TimeoutError:
            return f"no answer to GET /health within {HEALTH_TIMEOUT_S:g} s"
        except aiohttp.ClientError as e:
            return f"unreachable ({e or type(e).__name__})"
        if response.status < 400 or response.status == 404:
            return None
        return f"GET /health answered {response.status}"

    async def not_inference_server(self) -> str | None:
        """Why this URL is no inference server, where its answers say so: GET /v1/models (which
        vLLM, SGLang and raas engine answer with an OpenAI model list, ``{"data": [{"id":
        ...}]}``) answers something else; a raas server is named as one. None when it lists
        models, has no such route (404), or does not answer (the health check reports that)."""
        try:
            answer = await self._send("GET", "/v1/models", timeout_s=MODELS_TIMEOUT_S)
        except TRANSPORT_ERRORS:
            return None
        if answer.status == 404 or (answer.status < 300 and is_model_list(answer.body)):
            return None
        if await self._is_raas_server():
            return (
                f"{self.url} answers /v1/models without a model list: it is a raas server, not"
                " an inference server (give the URL of vLLM, SGLang or raas engine)"
            )
        if answer.status in (401, 403):
            return (
                f"{self.url} answers /v1/models with {answer.status}: it wants a key, and raas"
                " sends its inference servers none"
            )
        return (
            f"{self.url} answers /v1/models without a model list ({answer.status}): it is not an"
            " inference server (vLLM, SGLang or raas engine; a raas server?)"
        )

    async def _is_raas_server(self) -> bool:
        """Does the server answer raas's own health route, ``GET /healthz`` ``{"status": "ok"}``?"""
        try:
            answer = await self._send("GET", "/healthz", timeout_s=HEALTH_TIMEOUT_S)
            return answer.status == 200 and json.loads(answer.body) == {"status": "ok"}
        except (*TRANSPORT_ERRORS, ValueError):
            return False

    async def pause(self, mode: PauseMode) -> bool:
        """Pause the server through its own route (``mode``: see :data:`PauseMode`); False where
        it has none (the pool drains it instead). Answers once the server says it is paused."""
        return False

    async def resume(self) -> None:
        """Undo :meth:`pause` (only called after a pause that returned True)."""
        return None  # no route: nothing was paused

    async def _control(self, path: str, body: dict[str, Any] | None = None) -> bool:
        """POST a pause or resume route: True when done, False when the server has no such route
        (404); another answer is a BackendError."""
        try:
            response = await self._send("POST", path, orjson.dumps(body or {}), CONTROL_TIMEOUT_S)
        except TRANSPORT_ERRORS as e:
            raise BackendError(self.url, f"POST {path}: {type(e).__name__}: {e}") from e
        if response.status == 404:
            return False
        if response.status >= 400:
            raise BackendError(
                self.url, f"POST {path}: HTTP {response.status}: {response.text[:300]}"
            )
        return True

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        vocab_size: int | None = None,
        live: LiveCall | None = None,
    ) -> Generation:
        """Generate, and check the answer before anyone uses it (raas.llm.validation): one that
        is wrong (a NaN logprob, more tokens than asked for, an id outside the ``vocab_size``
        given) is a BackendError naming this backend and what was wrong. A client that streams
        counts each token into ``live`` as it comes."""
        start = time.perf_counter()
        generation = await self._generate(prompt_ids, params, live)
        problem = answer_problem(generation, params.max_tokens, vocab_size)
        if problem is not None:
            raise BackendError(self.url, problem, transient=False)
        return dataclasses.replace(
            generation, backend=self.url, latency_s=time.perf_counter() - start
        )

    @abstractmethod
    async def _generate(
        self, prompt_ids: list[int], params: SamplingParams, live: LiveCall | None
    ) -> Generation: ...


class VLLMClient(LLMClient):
    protocol = "vllm"

    async def pause(self, mode: PauseMode) -> bool:
        return await self._control(f"/pause?mode={mode}")  # vLLM's modes keep and abort

    async def resume(self) -> None:
        await self._control("/resume")

    async def _model_name(self) -> str:
        if self.model is None:
            try:
                response = await self._send("GET", "/v1/models", timeout_s=MODELS_TIMEOUT_S)
                self.model = str(json.loads(response.body)["data"][0]["id"])
            except (*TRANSPORT_ERRORS, ValueError, KeyError, IndexError, TypeError) as e:
                raise BackendError(self.url, f"cannot list its models: {e}") from e
        return self.model

    async def _generate(
        self, prompt_ids: list[int], params: SamplingParams, live: LiveCall | None
    ) -> Generation:
        body: dict[str, Any] = {
            "model": await self._model_name(),
            "prompt": prompt_ids,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            body["seed"] = params.seed
        if not self.stream or self.streams is False:  # (a server that answered whole once)
            return self._read(await self._post("/v1/completions", body))
        # Streamed, so that a turn's tokens are counted as they come and a backend that sends
        # none is told from a slow one (the usage chunk carries the cached tokens).
        body["stream"], body["stream_options"] = True, {"include_usage": True}
        stream = _CompletionStream(self.url, params.max_tokens, live)
        whole = await self._post_stream("/v1/completions", body, stream.add, live)
        return self._read(stream.answer() if whole is None else whole)

    def _read(self, data: dict[str, Any]) -> Generation:
        """The Generation in a whole ``/v1/completions`` answer (or a stream joined into one)."""
        try:
            choice = data["choices"][0]
            logprobs = choice["logprobs"] or {}
            token_ids = choice.get("token_ids")
            if token_ids is None:  # vLLM < 0.10.2: token ids only as "token_id:N" strings
                token_ids = [int(str(t).split(":", 1)[1]) for t in logprobs["tokens"]]
            token_ids = list(token_ids)  # as they came: one that is no integer is refused
            values = [0.0 if x is None else float(x) for x in logprobs.get("token_logprobs") or []]
            finish = str(choice.get("finish_reason") or "stop")
            usage = data.get("usage") or {}
            cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
            # vLLM says nothing of its weights; raas's engine adds SGLang's fields.
            versions = policy_versions(data, len(token_ids))
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BackendError(self.url, f"unexpected completion shape: {e}", False) from e
        return Generation(token_ids, values, finish, cached_tokens=cached, policy_versions=versions)


class _CompletionStream:
    """A vLLM ``/v1/completions`` stream, read into the shape of its whole answer: each chunk's
    ``token_ids`` (older vLLM: ``logprobs.tokens`` as ``token_id:N``) and logprobs appended, the
    finish reason of the last chunk that gives one, the usage chunk's usage, and the weight
    versions raas's engine puts on its last chunk. Each chunk's tokens are counted into
    ``live`` as it comes."""

    def __init__(self, backend: str, max_tokens: int, live: LiveCall | None) -> None:
        self.backend, self.max_tokens, self.live = backend, max_tokens, live
        self.counted = 0
        self.token_ids: list[Any] | None = None  # None: no chunk had token_ids
        self.tokens: list[Any] = []
        self.values: list[Any] = []
        self.finish: Any = None
        self.extra: dict[str, Any] = {}
        self.given = False  # an event brought tokens (with ids, or without: token_ids says)

    def add(self, event: dict[str, Any]) -> int:
        """Take in one event; the number of tokens it brought. An event whose choice is not the
        one asked for (``index`` 0), whose logprobs do not go one to one with its tokens, or
        that gives ids where an earlier one gave none (or none where one gave them) is refused:
        the whole answer's lengths would still agree while a logprob stood beside another
        token than its own."""
        brought = 0
        try:
            for choice in event.get("choices") or ():
                if choice.get("index", 0) != 0:
                    raise BackendError(
                        self.backend, f"streamed choice {choice.get('index')!r}, not 0", False
                    )
                logprobs = choice.get("logprobs") or {}
                ids = choice.get("token_ids")
                names = logprobs.get("tokens") or []
                values = logprobs.get("token_logprobs") or []
                came = len(ids) if ids is not None else len(names)
                # Counted as the most of what the event holds, so that no list grows unbounded
                # beside an empty one.
                self.counted += max(came, len(names), len(values))
                if self.counted > self.max_tokens:  # held in memory no further
                    raise BackendError(
                        self.backend, f"streamed more than max_tokens={self.max_tokens}", False
                    )
                if len(values) != came or (names and len(names) != came):
                    raise BackendError(
                        self.backend,
                        f"a stream event of {came} tokens with {len(values)} logprobs"
                        f" and {len(names)} token names",
                        False,
                    )
                if came and (ids is None) != (self.token_ids is None) and self.given:
                    raise BackendError(
                        self.backend, "a stream that gives token_ids in some events only", False
                    )
                if ids is not None:
                    self.token_ids = self.token_ids if self.token_ids is not None else []
                    self.token_ids += ids
                self.given = self.given or came > 0
                self.tokens += names
                self.values += values
                self.finish = choice.get("finish_reason") or self.finish
                brought += came
                if self.live is not None:
                    self.live.count(came)
            for key in ("usage", "weight_version", "weight_versions"):
                if event.get(key) is not None:
                    self.extra[key] = event[key]
        except (AttributeError, TypeError) as e:  # read as a shape error in _read
            self.extra["error"] = f"{type(e).__name__}: {e}"
        return brought

    def answer(self) -> dict[str, Any]:
        """The stream as a whole answer, for ``VLLMClient._read``."""
        if "error" in self.extra:
            error = self.extra["error"]
            raise BackendError(self.backend, f"unexpected completion stream shape: {error}", False)
        choice = {
            "token_ids": self.token_ids,
            "logprobs": {"tokens": self.tokens, "token_logprobs": self.values},
            "finish_reason": self.finish,
        }
        return {"choices": [choice], **self.extra}


class SGLangClient(LLMClient):
    protocol = "sglang"
    # "retract" sends the running requests back to SGLang's queue: once it continues they are
    # prefilled again (under the new weights) and go on with the tokens they had.
    PAUSE_MODES: ClassVar[dict[str, str]] = {"keep": "retract", "abort": "abort"}

    async def pause(self, mode: PauseMode) -> bool:
        return await self._control("/pause_generation", {"mode": self.PAUSE_MODES[mode]})

    async def resume(self) -> None:
        await self._control("/continue_generation")

    async def _generate(
        self, prompt_ids: list[int], params: SamplingParams, live: LiveCall | None
    ) -> Generation:
        sampling: dict[str, Any] = {
            "max_new_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "skip_special_tokens": False,
        }
        if params.stop_token_ids:
            sampling["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            sampling["sampling_seed"] = params.seed
        body = {"input_ids": prompt_ids, "sampling_params": sampling, "return_logprob": True}
        data = await self._post("/generate", body)
        try:
            meta = data["meta_info"]
            entries = meta["output_token_logprobs"]
            token_ids = list(data.get("output_ids") or [e[1] for e in entries])
            values = [float(e[0]) if e[0] is not None else 0.0 for e in entries]
            reason = meta.get("finish_reason") or {}
            finish = str(reason.get("type", "stop")) if isinstance(reason, dict) else str(reason)
            cached = int(meta.get("cached_tokens") or 0)
            versions = policy_versions(meta, len(token_ids))
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BackendError(self.url, f"unexpected /generate shape: {e}", False) from e
        return Generation(token_ids, values, finish, cached_tokens=cached, policy_versions=versions)


class VerlClient(LLMClient):
    """The verl-style ``/generate`` used by ProRL's trainer integration."""

    protocol = "verl"

    async def _generate(
        self, prompt_ids: list[int], params: SamplingParams, live: LiveCall | None
    ) -> Generation:
        body: dict[str, Any] = {
            "prompt_ids": prompt_ids,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "skip_special_tokens": False,
        }
        if params.top_k > 0:
            body["top_k"] = params.top_k
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        data = await self._post("/generate", body)
        try:
            token_ids = list(data["response_ids"])
            values = [float(x) for x in data.get("logprobs") or []]
        except (KeyError, TypeError, ValueError) as e:
            raise BackendError(self.url, f"unexpected /generate shape: {e!r}", False) from e
        if not values and token_ids:
            raise BackendError(self.url, "no logprobs in the answer", transient=False)
        finish = "length" if len(token_ids) >= params.max_tokens else "stop"
        return Generation(token_ids, values, str(data.get("finish_reason") or finish))


CLIENTS: dict[str, type[LLMClient]] = {
    c.protocol: c for c in (VLLMClient, SGLangClient, VerlClient)
}


def is_model_list(body: bytes) -> bool:
    """Is ``body`` an OpenAI model list with a model in it (``{"data": [{"id": "m"}]}``)?"""
    try:
        data = json.loads(body)["data"]
        return bool(data) and all(isinstance(m["id"], str) for m in data)
    except (ValueError, KeyError, TypeError):
        return False


def make_client(
    protocol: str,
    address: str,
    model: str | None = None,
    stall_timeout_s: float = STALL_TIMEOUT_S,
    stream: bool = True,
) -> LLMClient:
    try:
        cls = CLIENTS[protocol]
    except KeyError:
        raise ValueError(
            f"unknown backend protocol {protocol!r} (have: {', '.join(sorted(CLIENTS))})"
        ) from None
    return cls(address, model=model, stall_timeout_s=stall_timeout_s, stream=stream)
