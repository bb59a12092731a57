"""Gateway sessions: an OpenAI-style API per job, for agent programs raas did not write.

The agent calls ``/v1/chat/completions`` or ``/v1/responses`` as it would call OpenAI,
``/v1/messages`` as it would call Anthropic, or ``/v1beta/models/{model}:generateContent`` as it
would call Gemini (raas.llm.openai_responses, raas.llm.anthropic_messages and
raas.llm.gemini_content translate). The session renders the conversation with the model's chat
template (tools included), generates token ids through the backend pool (sticky per job), parses
the reply back into OpenAI's shape, and records every call: its prompt ids, output ids and
logprobs.

Calls are merged into trajectory *segments* by prefix. A call continues a segment when its
conversation is that segment's conversation plus new messages (the assistant turns exactly as the
gateway answered them): its prompt is then built from the segment's own tokens, the generated
ones exactly as they came, plus the template's delta for the new messages (loss_mask 0,
logprobs 0.0), as raas's own agent loop does, so nothing is re-tokenized and nothing drifts. A
call whose prompt ids extend a segment's tokens continues it too. Any other call (context
compaction, a sub-agent) starts a new segment.

A continuing call's conversation is rendered whole, before generating: where that extends the
segment's tokens, it is the prompt. Only the new messages' part of the text is tokenized: each
segment keeps the text of its latest rendering up to its last end-of-turn token (where the
tokenizer splits, so that text's tokens are the segment's first ones), and a rendering that
starts with that text tokenizes the rest alone. Where the prompt does not extend the segment's
tokens, either the template rewrites earlier turns (Qwen3's drops the ``<think>`` reasoning of
the turns before a new user message): the call then starts a new segment from the template's
rendering (``rewritten`` in its record, ``gateway_rewrites`` in the metrics), so nothing drifts
silently; or the template adds the new messages without touching earlier ones (rendering the
conversation with and without them gives a prefix: the delta is exact) and only the model's own
tokens re-encode otherwise: the call continues the segment with that delta, and ``drift`` counts
it.

Each segment is a ``raas.wire.Trajectory`` (``Segment``) and records each call's prompt as
given to the model, so the pipeline checks every segment's invariant as it checks a job's
trajectory. ``session.trajectory`` is the *first* segment (its token lists are shared, so it is
complete at every await); every call's record goes into ``trajectory.turns`` (with its
``segment`` index), and ``session.segments`` holds them all (``session.metrics()`` for a
result's metrics).

Each call's record holds the sampling keys the agent sent (``sampling_sent``: temperature,
top_p, seed, its max tokens, stop) and the parameters it was generated with (``sampling``). A
gateway made with ``fixed_sampling`` (``raas serve --gateway-fixed-sampling``) answers a call that
sends a temperature, top_p or seed other than the job's with a 400 in OpenAI's shape naming the
parameter, so that every token is drawn as the trainer asked.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from pydantic import PrivateAttr

from raas.agent.loop import Generator
from raas.llm.anthropic_messages import (
    CountTokensRequest,
    MessagesRequest,
    messages_answer,
)
from raas.llm.anthropic_messages import error_answer as anthropic_error
from raas.llm.chat import encode, end_of_turn, sequel_delta, split_point
from raas.llm.gemini_content import CountTokensRequest as GeminiCountRequest
from raas.llm.gemini_content import (
    CountTokensResponse,
    GenerateContentRequest,
    content_answer,
)
from raas.llm.gemini_content import error_answer as google_error
from raas.llm.openai_chat import (
    ChatOutput,
    chat_answer,
    prompt_text,
    read_output,
    render_prompt,
    reply_message,
    same,
    template_messages,
)
from raas.llm.openai_responses import ResponsesRequest, response_object, responses_answer
from raas.llm.openai_types import ChatRequest, OpenAIError, Sampled, read
from raas.llm.toolcalls import ParsedOutput, ToolCallParser, get_parser
from raas.llm.types import BackendError, Generation, NoBackendAvailable, SamplingParams
from raas.sandbox.client import UNAUTHORIZED, token_matches
from raas.wire import Trajectory, policy_version_fields

Reply = tuple[int, dict[str, str], bytes]
JSON_HEADERS = {"content-type": "application/json"}


@dataclass(frozen=True)
class _Head:
    """A rendering's text up to a point where the tokenizer splits (see
    :func:`raas.llm.chat.split_point`), and how many tokens it makes: a segment's first ones."""

    text: str
    n: int


class Segment(Trajectory):
    """One run of calls that extend each other: a trajectory of its own (its tokens, messages
    and calls), with the tools its calls were rendered with."""

    tools: list[dict[str, Any]] | None = None
    drift: int = 0  # continuing calls whose full re-rendering differs from the tokens kept
    # Its ids only grow, so a head once true stays true; the latest saves the most.
    _head: _Head | None = PrivateAttr(default=None)

    def out(self) -> dict[str, Any]:
        return self.model_dump(exclude={"tools", "stop_reason"})


@dataclass
class _Call:
    """A call's prompt, and the segment it continues (None: a new one)."""

    prompt: list[int]
    segment: Segment | None
    inserted: list[int]  # the tokens between the segment's ids and the prompt
    drift: bool  # continued, though re-rendering its conversation gives other tokens
    rewritten: bool = False  # new, since the template rewrote the segment's earlier turns
    head: _Head | None = None  # where the prompt is the rendering's tokens: the head of its text


def _new_token() -> str:
    return f"raas-{secrets.token_urlsafe(32)}"


@dataclass(eq=False)
class GatewaySession:
    """One job's OpenAI-style API: the agent authenticates with ``token``."""

    job_id: str
    llm: Generator
    tokenizer: Any
    params: SamplingParams
    trajectory: Trajectory
    _: KW_ONLY
    model: str = "raas"
    tool_format: str = "hermes"
    fixed_sampling: bool = False  # refuse a call that changes the job's sampling
    token: str = field(default_factory=_new_token)
    segments: list[Segment] = field(default_factory=list, init=False)
    calls: int = field(default=0, init=False)
    closed: bool = field(default=False, init=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.parser: ToolCallParser = get_parser(self.tool_format)

    # -- the one entry point ------------------------------------------------------------------

    async def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        """Serve one request; every failure is an error answer in the API's own shape (see
        :func:`error_reply`), never a raise.

        ``headers`` (names in lower case) must carry this session's token: the sandbox's relay
        reaches this session whatever token the agent sends, so the check is made here.
        """
        path, _, query = path.partition("?")
        path = "/" + path.strip("/")
        if not path.startswith(("/v1/", "/v1beta/")):
            path = "/v1" + path  # a client whose base_url lacks /v1
        if not self.authorized(headers, query):
            return await unauthorized(path)
        try:
            route = ROUTES.get(route_of(path))
            if route is None:
                raise OpenAIError(404, f"no route {path}", None, code="unknown_url")
            want, fn = route
            if method.upper() != want:
                raise OpenAIError(405, f"{path} takes {want}, not {method}", None)
            if self.closed:
                raise _refused("this job's gateway session is closed")
            return await fn(self, body)
        except OpenAIError as e:
            return error_reply(path, e)
        except (NoBackendAvailable, BackendError) as e:
            return error_reply(path, OpenAIError(503, str(e), None, "server_error"))
        except Exception as e:  # a bug must not take the agent's connection down with a 500 page
            err = OpenAIError(500, f"{type(e).__name__}: {e}", None, "server_error")
            return error_reply(path, err)

    def authorized(self, headers: dict[str, str], query: str = "") -> bool:
        """Whether the request holds this session's token (``Authorization: Bearer``,
        ``x-api-key``, ``x-goog-api-key``, or ``key`` in its ``query``)."""
        return token_matches(headers, self.token, query)

    # -- routes -------------------------------------------------------------------------------

    async def _models(self, _: bytes) -> Reply:
        card = {"id": self.model, "object": "model", "created": 0, "owned_by": "raas"}
        return _reply(200, {"object": "list", "data": [card]})

    async def _chat(self, body: bytes) -> Reply:
        request = read(ChatRequest, body)
        self._check(request)
        params = request.sampling(self.params)
        out, gen, n_prompt = await self._generate(
            request.conversation(), request.shown_tools(), params, request.stops, request
        )
        kind, answer = chat_answer(
            request, self.model, self.tokenizer, out, gen.logprobs, n_prompt, gen.cached_tokens
        )
        return 200, {"content-type": kind}, answer

    async def _responses(self, body: bytes) -> Reply:
        request = read(ResponsesRequest, body)
        self._check(request)
        params = request.sampling(self.params)
        out, gen, n_prompt = await self._generate(
            request.conversation(), request.shown_tools(), params, [], request
        )
        response = response_object(request, self.model, out, params, n_prompt, gen.cached_tokens)
        kind, answer = responses_answer(response, bool(request.stream))
        return 200, {"content-type": kind}, answer

    async def _messages(self, body: bytes) -> Reply:
        request = read(MessagesRequest, body)
        self._check(request)
        params = request.sampling(self.params)
        out, _, n_prompt = await self._generate(
            request.conversation(), request.shown_tools(), params, request.stops, request
        )
        kind, answer = messages_answer(request, self.model, out, n_prompt)
        return 200, {"content-type": kind}, answer

    async def _count_tokens(self, body: bytes) -> Reply:
        request = read(CountTokensRequest, body)
        prompt = render_prompt(self.tokenizer, request.conversation(), request.shown_tools())
        return _reply(200, {"input_tokens": len(prompt)})

    async def _generate_content(self, body: bytes, stream: bool = False) -> Reply:
        request = read(GenerateContentRequest, body)
        self._check(request)
        params = request.sampling(self.params)
        out, gen, n_prompt = await self._generate(
            request.conversation(), request.shown_tools(), params, request.stops, request
        )
        kind, answer = content_answer(stream, self.model, out, n_prompt, gen.cached_tokens)
        return 200, {"content-type": kind}, answer

    async def _stream_generate_content(self, body: bytes) -> Reply:
        return await self._generate_content(body, stream=True)

    async def _count_gemini_tokens(self, body: bytes) -> Reply:
        request = read(GeminiCountRequest, body)
        prompt = render_prompt(self.tokenizer, request.conversation(), request.shown_tools())
        return _reply(200, CountTokensResponse(totalTokens=len(prompt)).model_dump())

    def _check(self, request: Sampled) -> None:
        """Raises the 400 for a request that would change the job's sampling, where this
        session fixes it."""
        refusal = request.override_of(self.params) if self.fixed_sampling else None
        if refusal is not None:
            raise refusal

    # -- generation and recording -------------------------------------------------------------

    async def _generate(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        params: SamplingParams,
        stops: list[str],
        request: Sampled,
    ) -> tuple[ChatOutput, Generation, int]:
        tok = self.tokenizer
        call = self._plan(messages, tools)
        start = time.perf_counter()
        gen = await self.llm.generate(self.job_id, call.prompt, params)
        if len(gen.token_ids) != len(gen.logprobs):
            raise BackendError(gen.backend, "token ids and logprobs differ in length", False)
        parser = self.parser if tools is not None else None
        out = read_output(tok, gen.token_ids, gen.finish_reason, stops, parser)
        ids, logprobs = out.ids, list(gen.logprobs[: len(out.ids)])
        parsed, text = out.parsed, out.text
        async with self._lock:
            sampling = {"sampling_sent": request.sent_sampling(), "sampling": params.model_dump()}
            self._record(call, messages, tools, ids, logprobs, gen, parsed, text, start, sampling)
        return out, gen, len(call.prompt)

    def _plan(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> _Call:
        """The call's prompt ids, and which segment (if any) it continues."""
        text = prompt_text(self.tokenizer, messages, tools)
        for seg in reversed(self.segments):  # the latest first
            n = len(seg.messages)
            if seg.tools != tools or not n or len(messages) <= n:
                continue
            if all(same(a, b) for a, b in zip(messages[:n], seg.messages, strict=False)):
                return self._sequel(seg, messages, tools, text)
        rendered = encode(self.tokenizer, text)
        head = self._head(text, rendered)
        for seg in reversed(self.segments):
            ids = seg.ids
            if seg.tools == tools and len(rendered) > len(ids) and rendered[: len(ids)] == ids:
                return _Call(rendered, seg, rendered[len(ids) :], False, head=head)
        return _Call(rendered, None, [], False, head=head)

    def _tokens(self, seg: Segment, text: str) -> list[int]:
        """The tokens of ``text``: where it starts with the text of ``seg``'s head, the head's
        tokens (the segment's first ones), then those of the rest, which alone is tokenized."""
        head = seg._head
        if head is None or not text.startswith(head.text):
            return encode(self.tokenizer, text)
        return seg.ids[: head.n] + encode(self.tokenizer, text[len(head.text) :])

    def _head(self, text: str, rendered: list[int]) -> _Head | None:
        """The head of a rendering ``text`` whose tokens are ``rendered``."""
        cut = split_point(self.tokenizer, text)
        if cut is None:
            return None
        # The text's last end-of-turn token is its tokens' last: the head's end (found from the
        # back, since only the generation prompt follows it).
        eos, n = self.tokenizer.eos_token_id, len(rendered)
        while n and rendered[n - 1] != eos:
            n -= 1
        return _Head(text[:cut], n) if n else None

    def _sequel(
        self,
        seg: Segment,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        text: str,
    ) -> _Call:
        """A call whose conversation is ``seg``'s plus new messages: it continues ``seg`` where
        the template's rendering of it extends the segment's tokens, or where the template adds
        the new messages without touching the earlier ones (the model's own tokens then
        re-encode otherwise: drift, counted). A template that rewrites earlier turns (Qwen3's
        drops the reasoning before a new user message) starts a new segment from its rendering,
        so the model sees what its template gives it, and the kept tokens never drift from it."""
        ids, rendered = seg.ids, self._tokens(seg, text)
        if len(rendered) > len(ids) and rendered[: len(ids)] == ids:
            head = self._head(text, rendered)
            return _Call(rendered, seg, rendered[len(ids) :], False, head=head)
        tok, n = self.tokenizer, len(seg.messages)
        before, after = template_messages(tok, messages[:n]), template_messages(tok, messages[n:])
        delta = sequel_delta(tok, before, after, tools)
        if delta is None:
            head = self._head(text, rendered)
            return _Call(rendered, None, [], False, rewritten=True, head=head)
        inserted = end_of_turn(tok, ids) + delta
        return _Call(ids + inserted, seg, inserted, True)

    def _record(
        self,
        call: _Call,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        ids: list[int],
        logprobs: list[float],
        gen: Generation,
        parsed: ParsedOutput,
        text: str,
        start: float,
        sampling: dict[str, Any],
    ) -> None:
        seg = call.segment
        if seg is not None and seg.ids != call.prompt[: len(call.prompt) - len(call.inserted)]:
            seg = None  # a concurrent call extended it meanwhile: this one branches off
        if seg is None:
            seg = Segment(prompt_ids=call.prompt, tools=tools)
            self.segments.append(seg)
            if len(self.segments) == 1:
                self._share(seg)
        else:
            seg.add_inserted(call.inserted)
            seg.drift += call.drift
        seg.next_prompt()  # the segment's ids are now the call's prompt
        if call.head is not None:
            seg._head = call.head
        seg.add_generated(ids, logprobs)
        seg.messages[:] = [*messages, reply_message(parsed)]
        self.calls += 1
        record = {
            "turn": self.calls - 1,
            # by identity: two segments of the same tokens are equal as models
            "segment": next(i for i, s in enumerate(self.segments) if s is seg),
            "backend": gen.backend,
            "prompt_tokens": len(call.prompt),
            "output_tokens": len(ids),
            "cached_tokens": gen.cached_tokens,
            "finish_reason": gen.finish_reason,
            "generate_s": gen.latency_s,
            **policy_version_fields(gen.policy_versions),
            "call_s": time.perf_counter() - start,
            "drift": call.drift,
            "rewritten": call.rewritten,
            "text": text,
            "content": parsed.content,
            "tool_calls": [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in parsed.calls
            ],
            "format_errors": parsed.errors,
            "malformed_tool_calls": len(parsed.errors),
            **sampling,  # what the agent sent, and what the call was generated with
        }
        seg.turns.append(record)
        self.trajectory.turns.append(record)

    def _share(self, seg: Segment) -> None:
        """The trajectory is the first segment: it shares the segment's lists."""
        traj = self.trajectory
        traj.prompt_ids, traj.response_ids = seg.prompt_ids, seg.response_ids
        traj.loss_mask, traj.logprobs = seg.loss_mask, seg.logprobs
        traj.messages = seg.messages

    # -- what a task reports ------------------------------------------------------------------

    @property
    def drift(self) -> int:
        return sum(s.drift for s in self.segments)

    @property
    def rewrites(self) -> int:
        """Calls that started a segment since the template rewrote earlier turns."""
        return sum(bool(t.get("rewritten")) for t in self.trajectory.turns)

    def metrics(self, with_segments: bool = True) -> dict[str, Any]:
        """For a result's metrics: calls, segments, drift, and every segment's tokens."""
        out: dict[str, Any] = {
            "gateway_calls": self.calls,
            "gateway_segments": len(self.segments),
            "gateway_drift": self.drift,
            "gateway_rewrites": self.rewrites,
        }
        if with_segments:
            out["segments"] = [s.out() for s in self.segments]
        return out


GEMINI = "/v1beta/models/{model}"  # then :generateContent, :streamGenerateContent, :countTokens
# Greedy, as the server's route (a model's name may hold a colon), and a name of one segment.
_GEMINI_PATH = re.compile(
    r"^/v1beta/models/[^/]+:(generateContent|streamGenerateContent|countTokens)$"
)

ROUTES: dict[str, tuple[str, Callable[[GatewaySession, bytes], Awaitable[Reply]]]] = {
    "/v1/chat/completions": ("POST", GatewaySession._chat),
    "/v1/responses": ("POST", GatewaySession._responses),
    "/v1/models": ("GET", GatewaySession._models),
    "/v1/messages": ("POST", GatewaySession._messages),
    "/v1/messages/count_tokens": ("POST", GatewaySession._count_tokens),
    GEMINI + ":generateContent": ("POST", GatewaySession._generate_content),
    GEMINI + ":streamGenerateContent": ("POST", GatewaySession._stream_generate_content),
    GEMINI + ":countTokens": ("POST", GatewaySession._count_gemini_tokens),
}
PATHS = frozenset(ROUTES)


def route_of(path: str) -> str:
    """The route ``path`` (as the session reads it) takes: itself, or for one of Gemini's
    methods the route's template (any model: the gateway answers with the job's)."""
    match = _GEMINI_PATH.match(path)
    return f"{GEMINI}:{match[1]}" if match else path


def is_gateway_path(path: str) -> bool:
    """Does ``path`` (as the server routes it) reach the gateway (and so take a job token)?"""
    return route_of(path) in PATHS


class Gateway:
    """The service's gateway sessions, one per job, each behind its own unguessable token."""

    def __init__(
        self,
        llm: Generator,
        tokenizer: Callable[[], Any],
        model: str = "raas",
        tool_format: str = "hermes",
        fixed_sampling: bool = False,
    ) -> None:
        self.llm = llm
        self._tokenizer = tokenizer  # loads (or returns the loaded) tokenizer
        self.model = model
        self.tool_format = tool_format
        self.fixed_sampling = fixed_sampling  # refuse calls that change a job's sampling
        self._sessions: dict[str, GatewaySession] = {}

    def open(self, job_id: str, params: SamplingParams, trajectory: Trajectory) -> GatewaySession:
        """A new session for ``job_id``; the agent authenticates with ``session.token``."""
        tokenizer = self._tokenizer()
        session = GatewaySession(
            job_id,
            self.llm,
            tokenizer,
            params,
            trajectory,
            model=self.model,
            tool_format=self.tool_format,
            fixed_sampling=self.fixed_sampling,
        )
        self._sessions[session.token] = session
        return session

    def session(self, token: str) -> GatewaySession | None:
        # A dict lookup by the whole token: its hash decides, so no timing reveals a prefix
        # worth guessing at (the token holds 256 random bits).
        return self._sessions.get(token)

    def close(self, token: str) -> None:
        session = self._sessions.pop(token, None)
        if session is not None:
            session.closed = True

    def __len__(self) -> int:
        return len(self._sessions)


def speaks_anthropic(path: str) -> bool:
    """Is ``path`` (as the session reads it: from /v1) one of Anthropic's API?"""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def speaks_gemini(path: str) -> bool:
    """Is ``path`` one of Gemini's API (``/v1beta/``)?"""
    return path.startswith("/v1beta/")


def error_answer(path: str, err: OpenAIError) -> tuple[int, dict[str, Any]]:
    """``err`` as the API of ``path`` answers it: Anthropic's shape (and statuses) on
    ``/v1/messages``, Google's on ``/v1beta/``, OpenAI's elsewhere."""
    if speaks_anthropic(path):
        return anthropic_error(err)
    return google_error(err) if speaks_gemini(path) else (err.status, err.body())


def error_reply(path: str, err: OpenAIError) -> Reply:
    return _reply(*error_answer(path, err))


async def unauthorized(path: str) -> Reply:
    return error_reply(path, _refused(UNAUTHORIZED))


def _refused(message: str) -> OpenAIError:
    return OpenAIError(401, message, None, "authentication_error", "invalid_api_key")


def _reply(status: int, body: dict[str, Any]) -> Reply:
    return status, dict(JSON_HEADERS), json.dumps(body).encode()
