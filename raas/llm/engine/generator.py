"""The engine proper: one worker thread that batches requests and decodes them together.

Every torch call runs on the worker thread, never on an event loop. Requests wait in a queue;
between two decode steps the worker admits as many as fit (``max_batch``), prefills each one on its
own (reusing a cached prefix when there is one), and merges it into the running batch, whose rows
are left-padded key/value caches with a 2D attention mask and explicit position ids. Each row has
its own sampling parameters and random generator and leaves the batch when it stops.

Weight updates (``weight_updates``): ``"between_batches"`` (the default) waits until the batch
has drained, and requests that arrive meanwhile wait for it, so a generation has one version;
``"between_steps"`` applies an update between two decode steps: the generations in flight go on
under the new weights (the keys and values of their tokens so far are kept, as SGLang's
``in_place`` pause keeps them), nothing is aborted and nothing waits. Either way each generated
token records the weight version it was sampled under (``GenerationResult.weight_versions``), so a
trajectory says which policy generated which tokens whatever the order of updates and steps.

:meth:`Engine.pause` is vLLM's ``/pause`` (its modes): ``"keep"`` freezes the batch where it is
(an update applies at once, and the batch goes on under it after :meth:`Engine.resume`),
``"wait"`` lets the batch finish and admits nothing, ``"abort"`` ends every generation in flight
or waiting with ``finish_reason`` ``"abort"`` and the tokens it had (a caller resumes it from that
prefix). Requests that arrive while paused wait for :meth:`Engine.resume`.

A caller that gives up (its future cancelled, :meth:`Engine.abort`, or the :meth:`Engine.generate`
coroutine cancelled) takes its sequence out: a waiting one leaves the queue at once, a running
one leaves the batch (and its key/value rows are dropped) before the next decode step. Stopping
the engine fails every request in flight or waiting with :class:`EngineStopped` after the current
step, without waiting for the generations to finish.

Logprobs are the raw model's: ``log_softmax`` of the unmodified logits, before temperature, top-k
and top-p, which is what a policy-gradient trainer needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

from raas.llm.engine.completion import GenerationResult
from raas.llm.engine.kv import KV, KVCache, assemble, clone, row_view
from raas.llm.engine.prefix_cache import PrefixCache
from raas.llm.engine.weight_dirs import WeightDirs

log = logging.getLogger(__name__)
_Item = TypeVar("_Item")  # what goes to the worker thread: a request or a weight update

GREEDY_TEMPERATURE = 1e-5
MIN_LOGPROB = -9999.0
MAX_TOP_LOGPROBS = 20

WeightUpdates = Literal["between_batches", "between_steps"]
PauseMode = Literal["keep", "wait", "abort"]  # vLLM's /pause modes


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    top_logprobs: int = 0  # alternatives to return per position (raw logprobs)

    @property
    def greedy(self) -> bool:
        return self.temperature <= GREEDY_TEMPERATURE


@dataclass
class EngineStats:
    requests: int = 0  # finished generations
    generated_tokens: int = 0  # every token generated, also of aborted and unfinished ones
    aborted: int = 0  # generations cancelled by their caller (an HTTP client that left)
    prefix_cache_hits: int = 0
    cached_tokens: int = 0
    batches: int = 0
    decode_steps: int = 0
    weight_version: int = 0


class EngineStopped(RuntimeError):
    pass


class PromptError(ValueError):
    """A request the engine cannot serve; ``param`` names the field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class WeightsError(ValueError):
    """A checkpoint that does not fit the model; the model keeps its weights."""


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    params: GenerationParams
    future: Future[GenerationResult]
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] | None = None
    versions: list[int] = field(default_factory=list)  # the weight version of each token
    cached_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | None = None
    # Told of each token as it is sampled (on the engine's thread), for a streamed answer.
    listener: Callable[[int, float], None] | None = None


@dataclass(eq=False)
class _WeightUpdate:
    tensors: dict[str, torch.Tensor]
    future: Future[int]


def _resolve(future: Future[Any], value: Any) -> None:
    with contextlib.suppress(InvalidStateError):  # cancelled by the caller meanwhile
        future.set_result(value)


def _fail(future: Future[Any], error: BaseException) -> None:
    with contextlib.suppress(InvalidStateError):
        future.set_exception(error)


def checkpoint_files(path: Path, allowed: WeightDirs | None = None) -> list[Path]:
    """The safetensors files of a checkpoint: a file, or a directory with ``model.safetensors``
    or a sharded ``model.safetensors.index.json``. With ``allowed``, the path, the index and
    every file must lie in those directories, links followed (else :class:`PathRefused`)."""

    def check(p: Path) -> Path:
        return p if allowed is None else allowed.check(p)

    path = check(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise WeightsError(f"no such file or directory: {path}")
    index = check(path / "model.safetensors.index.json")
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            return [check(path / name) for name in sorted(set(weight_map.values()))]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise WeightsError(f"cannot read {index}: {e}") from e
    if (path / "model.safetensors").is_file():
        return [check(path / "model.safetensors")]
    found = sorted(path.glob("*.safetensors"))
    if len(found) == 1:
        return [check(found[0])]
    raise WeightsError(
        f"{path} has no model.safetensors or model.safetensors.index.json"
        + (f" (and {len(found)} other .safetensors files)" if found else "")
    )


def _keys(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


class Engine:
    """Batched generation with a prefix cache on one model, driven by one worker thread."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch: int = 8,
        prefix_cache_tokens: int = 32768,
        weight_updates: WeightUpdates = "between_batches",
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if weight_updates not in ("between_batches", "between_steps"):
            raise ValueError(f"weight_updates: {weight_updates!r}")
        self.weight_updates = weight_updates
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        config = model.config
        self.max_model_len = int(getattr(config, "max_position_embeddings", 0) or 2048)
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.num_layers = int(config.num_hidden_layers)
        self.eos_token_ids = self._eos_ids()
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.stats = EngineStats()
        self._cond = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._updates: deque[_WeightUpdate] = deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        # Paused (vLLM's mode) or None; the futures of pause() calls not yet answered; whether
        # an "abort" pause still has generations to end.
        self._paused: PauseMode | None = None
        self._pause_waiters: list[Future[None]] = []
        self._abort_all = False
        # The running batch (worker thread only).
        self._rows: list[_Request] = []
        self._lengths: list[int] = []  # positions held in the cache, per row
        self._cache: KVCache | None = None

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        generation = getattr(self.model, "generation_config", None)
        extra = getattr(generation, "eos_token_id", None)
        if isinstance(extra, int):
            ids.add(extra)
        elif isinstance(extra, list | tuple):
            ids.update(int(t) for t in extra)
        return frozenset(ids)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        with self._cond:
            if self._stopping:
                raise EngineStopped("the engine has been shut down")
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="raas-engine", daemon=True)
                self._thread.start()

    def _hand_over(self, queue: deque[_Item], item: _Item) -> None:
        """Queue ``item`` for the worker (started if need be) and wake it; EngineStopped once the
        engine is shut down."""
        self.start()
        with self._cond:
            if self._stopping:
                raise EngineStopped("the engine has been shut down")
            queue.append(item)
            self._cond.notify_all()

    def stop(self) -> None:
        """Ask the worker to stop after its current step, without waiting: requests in flight or
        waiting then fail with :class:`EngineStopped`, and new ones are refused."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the worker and wait for it; requests in flight or waiting fail with
        :class:`EngineStopped`."""
        self.stop()
        with self._cond:
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        self._fail_queued()

    def _fail_queued(self) -> None:
        with self._cond:
            waiting, self._waiting = list(self._waiting), deque()
            updates, self._updates = list(self._updates), deque()
        for request in waiting:
            _fail(request.future, EngineStopped("the engine shut down"))
        for update in updates:
            _fail(update.future, EngineStopped("the engine shut down"))

    # -- the public interface (any thread) ---------------------------------------------------

    def check_prompt(self, prompt: list[int], max_tokens: int) -> None:
        """Raise :class:`PromptError` unless the engine can serve this prompt and length."""
        if not prompt:
            raise PromptError("the prompt is empty", "prompt")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise PromptError(
                f"prompt token ids must be in [0, {self.vocab_size}): "
                f"got {', '.join(map(str, bad[:5]))}{' ...' if len(bad) > 5 else ''}",
                "prompt",
            )
        if max_tokens < 1:
            raise PromptError("max_tokens must be at least 1", "max_tokens")
        if len(prompt) + max_tokens > self.max_model_len:
            raise PromptError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the prompt, "
                f"{max_tokens} for max_tokens). Please reduce the length of the prompt or "
                "max_tokens.",
                "max_tokens",
            )

    def submit(
        self,
        prompt: list[int],
        params: GenerationParams,
        listener: Callable[[int, float], None] | None = None,
    ) -> Future[GenerationResult]:
        """Queue one generation; the future resolves when it has finished. ``listener``, where
        given, is called on the engine's thread with each token and its logprob as it is
        sampled: it must only hand them over (to an event loop, say), never block."""
        self.check_prompt(prompt, params.max_tokens)
        if not 0 <= params.top_logprobs <= MAX_TOP_LOGPROBS:
            raise PromptError(f"logprobs must be in [0, {MAX_TOP_LOGPROBS}]", "logprobs")
        generator = torch.Generator()
        if params.seed is not None:
            generator.manual_seed(params.seed)
        else:
            generator.seed()
        request = _Request(list(prompt), params, Future(), generator, listener=listener)
        if params.top_logprobs:
            request.top = []
        self._hand_over(self._waiting, request)
        return request.future

    def abort(self, future: Future[GenerationResult]) -> bool:
        """Give up a generation (a future from :meth:`submit`): it leaves the queue now, or the
        batch before the next decode step, and generates nothing more. Cancelling the future
        does the same, a little later for a waiting one. False if it had finished."""
        future.cancel()
        if not future.cancelled():
            return False
        with self._cond:
            for request in self._waiting:
                if request.future is future:
                    self._waiting.remove(request)
                    self.stats.aborted += 1
                    break
        return True

    async def generate(self, prompt: list[int], params: GenerationParams) -> GenerationResult:
        """Generate; cancelling the awaiting task aborts the generation."""
        future = self.submit(prompt, params)
        try:
            return await asyncio.wrap_future(future)
        finally:
            self.abort(future)  # nothing to do once it has finished

    def pause(self, mode: PauseMode = "abort") -> Future[None]:
        """Pause generation (vLLM's ``/pause`` modes, see the module docstring); the future
        resolves once the engine is paused: after the current step (``keep``), once the
        generations in flight have ended (``abort``) or finished (``wait``)."""
        if mode not in ("keep", "wait", "abort"):
            raise ValueError(f"pause mode {mode!r}: keep, wait or abort")
        future: Future[None] = Future()
        self.start()
        with self._cond:
            if self._stopping:
                raise EngineStopped("the engine has been shut down")
            self._paused = mode
            self._abort_all = self._abort_all or mode == "abort"
            self._pause_waiters.append(future)
            self._cond.notify_all()
        return future

    def resume(self) -> None:
        """Go on generating: a frozen batch continues, waiting requests are admitted."""
        with self._cond:
            self._paused, self._abort_all = None, False
            waiters, self._pause_waiters = self._pause_waiters, []
            self._cond.notify_all()
        for waiter in waiters:  # a pause that never got there is over anyway
            _resolve(waiter, None)

    @property
    def paused(self) -> bool:
        with self._cond:
            return self._paused is not None

    async def pause_async(self, mode: PauseMode = "abort") -> None:
        await asyncio.wrap_future(self.pause(mode))

    def read_weights(
        self, path: str | Path, allowed: WeightDirs | None = None
    ) -> dict[str, torch.Tensor]:
        """Load a safetensors checkpoint and check it fits the model exactly (every key, no
        unknown key, same shapes). Returns the tensors to copy, by state-dict key. Tied weights
        (an input embedding shared with the output layer) may appear under either name.

        With ``allowed``, the path and every file of the checkpoint must lie in those
        directories (:class:`PathRefused` otherwise, before anything is read)."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        files = checkpoint_files(Path(path), allowed)
        loaded: dict[str, torch.Tensor] = {}
        for file in files:
            try:
                loaded.update(load_file(str(file), device="cpu"))
            except (OSError, SafetensorError, ValueError, RuntimeError) as e:
                raise WeightsError(f"cannot read {file} as safetensors: {e}") from e
        state = self.model.state_dict()
        unexpected = sorted(set(loaded) - set(state))
        if unexpected:
            raise WeightsError(f"unexpected key(s) in the checkpoint: {_keys(unexpected)}")
        aliases: dict[tuple[int, tuple[int, ...]], list[str]] = {}
        for key, tensor in state.items():
            aliases.setdefault((tensor.data_ptr(), tuple(tensor.shape)), []).append(key)
        missing: list[str] = []
        out: dict[str, torch.Tensor] = {}
        for names in aliases.values():
            present = [n for n in names if n in loaded]
            if not present:
                missing.append(names[0])
                continue
            for name in present:
                got, want = tuple(loaded[name].shape), tuple(state[name].shape)
                if got != want:
                    raise WeightsError(
                        f"shape mismatch for {name!r}: checkpoint {got}, model {want}"
                    )
                if loaded[name].is_floating_point() != state[name].is_floating_point():
                    raise WeightsError(
                        f"dtype mismatch for {name!r}: checkpoint {loaded[name].dtype}, "
                        f"model {state[name].dtype}"
                    )
            out[names[0]] = loaded[present[0]]
        if missing:
            raise WeightsError(f"missing key(s) in the checkpoint: {_keys(sorted(missing))}")
        return out

    def submit_weights(self, tensors: dict[str, torch.Tensor]) -> Future[int]:
        """Queue checked tensors (from :meth:`read_weights`); applied once the batch drains, or
        at the next step (``weight_updates="between_steps"``, or while paused ``keep``).
        Resolves to the new weight version."""
        update = _WeightUpdate(tensors, Future())
        self._hand_over(self._updates, update)
        return update.future

    async def update_weights(self, path: str | Path, allowed: WeightDirs | None = None) -> int:
        tensors = await asyncio.to_thread(self.read_weights, path, allowed)
        return await asyncio.wrap_future(self.submit_weights(tensors))

    def snapshot(self) -> dict[str, int]:
        """The counters, read together (a decode step updates them under the same lock)."""
        with self._cond:
            waiting = len(self._waiting)
            s = dataclasses.replace(self.stats)
            running = len(self._rows)
        return {
            "requests": s.requests,
            "generated_tokens": s.generated_tokens,
            "aborted": s.aborted,
            "prefix_cache_hits": s.prefix_cache_hits,
            "cached_tokens": s.cached_tokens,
            "batches": s.batches,
            "decode_steps": s.decode_steps,
            "weight_version": s.weight_version,
            "running": running,
            "waiting": waiting,
            "prefix_cache_entries": len(self.prefix_cache),
            "prefix_cache_tokens": self.prefix_cache.tokens,
        }

    # -- the worker thread -------------------------------------------------------------------

    # What the worker may do now (all read under the lock).
    def _stepping(self) -> bool:
        return self._paused not in ("keep", "abort")

    def _admitting(self) -> bool:
        draining = self._updates and self.weight_updates == "between_batches"
        return self._paused is None and not draining

    def _updates_due(self) -> bool:
        anytime = self.weight_updates == "between_steps" or self._paused in ("keep", "abort")
        return bool(self._updates) and (anytime or not self._rows)

    def _pause_reached(self) -> bool:
        if self._paused is None or self._abort_all:
            return False
        return self._paused != "wait" or not self._rows

    def _ready(self) -> bool:
        return bool(
            self._stopping
            or self._abort_all
            or self._updates_due()
            or (self._pause_waiters and self._pause_reached())
            or (self._waiting and self._admitting())
            or (self._rows and self._stepping())
        )

    def _work(self) -> None:
        with torch.no_grad():
            while True:
                with self._cond:
                    while not self._ready():
                        self._cond.wait()
                    if self._stopping:
                        break
                    aborted: list[_Request] = []
                    if self._abort_all:  # a pause "abort": end every generation as it stands
                        aborted = self._rows + list(self._waiting)
                        self._rows, self._lengths, self._cache = [], [], None
                        self._waiting.clear()
                        self._abort_all = False
                    reached: list[Future[None]] = []
                    if self._pause_waiters and self._pause_reached():
                        reached, self._pause_waiters = self._pause_waiters, []
                    updates: list[_WeightUpdate] = []
                    if self._updates_due():
                        updates, self._updates = list(self._updates), deque()
                    admitted: list[_Request] = []
                    while (
                        self._admitting()
                        and self._waiting
                        and len(self._rows) + len(admitted) < self.max_batch
                    ):
                        request = self._waiting.popleft()
                        if request.future.cancelled():
                            self.stats.aborted += 1
                        else:
                            admitted.append(request)
                    stepping = self._stepping()
                for request in aborted:
                    self._end_aborted(request)
                for waiter in reached:
                    _resolve(waiter, None)
                for update in updates:
                    self._apply(update)
                try:
                    if admitted:
                        self._admit(admitted)
                    if self._rows and stepping:
                        self._step()
                except Exception as e:  # a bug or out of memory: fail this batch, keep serving
                    log.exception("generation failed")
                    for request in self._rows:
                        _fail(request.future, e)
                    with self._cond:
                        self._rows, self._lengths, self._cache = [], [], None
        with self._cond:
            rows, self._rows, self._lengths, self._cache = self._rows, [], [], None
            waiters, self._pause_waiters = self._pause_waiters, []
        for request in rows:
            _fail(request.future, EngineStopped("the engine shut down"))
        for waiter in waiters:
            _fail(waiter, EngineStopped("the engine shut down"))
        self._fail_queued()

    def _end_aborted(self, request: _Request) -> None:
        """Answer a generation ended by a pause ``abort`` with the tokens it has (its caller
        goes on from that prefix); its keys and values are dropped."""
        with self._cond:
            self.stats.requests += 1
        request.finish_reason = "abort"
        self._answer(request)

    def _apply(self, update: _WeightUpdate) -> None:
        try:
            state = self.model.state_dict()
            for key, tensor in update.tensors.items():
                state[key].copy_(tensor)
        except Exception as e:  # checked beforehand, so this is not expected
            log.exception("weight update failed")
            _fail(update.future, e)
            return
        self.prefix_cache.clear()
        self.stats.weight_version += 1
        log.info("weights updated: version %d", self.stats.weight_version)
        _resolve(update.future, self.stats.weight_version)

    def _admit(self, requests: list[_Request]) -> None:
        self.stats.batches += 1
        joining: list[tuple[_Request, KV]] = []
        for request in requests:
            if self._stopping:  # a stop waits for one prefill, not for each one admitted
                _fail(request.future, EngineStopped("the engine shut down"))
                continue
            try:
                kv = self._prefill(request)
            except Exception as e:
                log.exception("prefill failed")
                _fail(request.future, e)
                continue
            if request.future.cancelled():  # aborted during its prefill
                with self._cond:
                    self.stats.aborted += 1
            elif request.finish_reason is not None:
                self._finish(request, kv)
            else:
                joining.append((request, kv))
        if not joining:
            return
        rows: list[KV] = []
        if self._cache is not None:
            held = self._cache.tensors()
            rows = [row_view(held, i, n) for i, n in enumerate(self._lengths)]
        rows += [kv for _, kv in joining]
        lengths = self._lengths + [len(request.prompt) for request, _ in joining]
        cache = assemble(rows, lengths)
        with self._cond:
            self._rows = self._rows + [request for request, _ in joining]
            self._lengths, self._cache = lengths, cache

    def _prefill(self, request: _Request) -> KV:
        prompt = request.prompt
        hit, cached = self.prefix_cache.lookup(prompt)
        if cached is not None:
            cache = KVCache.holding(cached, spare=len(prompt) - hit)
            request.cached_tokens = hit
        else:
            cache = KVCache.empty(self.num_layers, spare=0)
        out = self.model(
            input_ids=torch.tensor([prompt[hit:]], dtype=torch.long),
            position_ids=torch.arange(hit, len(prompt), dtype=torch.long).unsqueeze(0),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        kv = cache.tensors()
        self.prefix_cache.insert(prompt, kv)  # its buffers hold exactly the prompt
        self._choose(out.logits[:, -1, :], [request])
        return kv

    def _step(self) -> None:
        keep = [i for i, r in enumerate(self._rows) if not r.future.cancelled()]
        if len(keep) < len(self._rows):
            aborted = len(self._rows) - len(keep)
            self._regroup(keep)
            with self._cond:
                self.stats.aborted += aborted
            if not self._rows:
                return
        assert self._cache is not None
        total = self._cache.length
        pads = [total - n for n in self._lengths]
        mask = None
        if any(pads):
            mask = torch.ones((len(pads), total + 1), dtype=torch.long)
            for i, pad in enumerate(pads):
                mask[i, :pad] = 0
        out = self.model(
            input_ids=torch.tensor([[r.tokens[-1]] for r in self._rows], dtype=torch.long),
            attention_mask=mask,
            position_ids=torch.tensor([[n] for n in self._lengths], dtype=torch.long),
            past_key_values=self._cache,
            use_cache=True,
        )
        self._lengths = [n + 1 for n in self._lengths]
        self._choose(out.logits[:, -1, :], self._rows, step=True)
        done = [i for i, r in enumerate(self._rows) if r.finish_reason is not None]
        if done:
            held = self._cache.tensors()
            finished = [(self._rows[i], clone(row_view(held, i, self._lengths[i]))) for i in done]
            self._regroup([i for i in range(len(self._rows)) if i not in set(done)])
            for request, kv in finished:  # out of the batch before their callers hear of it
                self._finish(request, kv)

    def _regroup(self, keep: list[int]) -> None:
        """Rebuild the batch with only the rows ``keep``, dropping padding no row needs."""
        rows = [self._rows[i] for i in keep]
        lengths = [self._lengths[i] for i in keep]
        cache = None
        if rows and self._cache is not None:
            held = self._cache.tensors()
            cache = assemble([row_view(held, i, self._lengths[i]) for i in keep], lengths)
        else:
            rows, lengths = [], []
        with self._cond:
            self._rows, self._lengths, self._cache = rows, lengths, cache

    def _choose(self, logits: torch.Tensor, rows: list[_Request], step: bool = False) -> None:
        """Pick the next token of each row, record its raw logprob, and decide if it stops; count
        the tokens (and the decode ``step``) together."""
        logits = logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        greedy = logits.argmax(dim=-1).tolist()
        version = self.stats.weight_version  # the weights these logits came from (same thread)
        for i, request in enumerate(rows):
            p = request.params
            token = int(greedy[i]) if p.greedy else self._sample(logits[i], p, request.generator)
            request.tokens.append(token)
            request.logprobs.append(max(float(logprobs[i, token]), MIN_LOGPROB))
            request.versions.append(version)
            if request.top is not None:
                values, ids = torch.topk(logprobs[i], p.top_logprobs)
                request.top.append(
                    [(int(t), max(float(v), MIN_LOGPROB)) for v, t in zip(values, ids, strict=True)]
                )
            if not p.ignore_eos and token in self.eos_token_ids:
                request.finish_reason = "stop"
            elif token in p.stop_token_ids:
                request.finish_reason, request.stop_reason = "stop", token
            elif len(request.tokens) >= p.max_tokens:
                request.finish_reason = "length"
            if request.listener is not None:
                request.listener(token, request.logprobs[-1])
        with self._cond:
            self.stats.generated_tokens += len(rows)
            self.stats.decode_steps += step

    @staticmethod
    def _sample(
        logits: torch.Tensor, p: GenerationParams, generator: torch.Generator | None
    ) -> int:
        scores = logits / p.temperature
        if 0 < p.top_k < scores.shape[-1]:
            kth = torch.topk(scores, p.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if p.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=True)
            probs = torch.softmax(ordered, dim=-1)
            # Keep the smallest set of tokens whose mass reaches top_p (the first always stays).
            drop = (torch.cumsum(probs, dim=-1) - probs) > p.top_p
            ordered = ordered.masked_fill(drop, float("-inf"))
            scores = torch.full_like(scores, float("-inf")).scatter(0, order, ordered)
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, 1, generator=generator).item())

    def _finish(self, request: _Request, kv: KV) -> None:
        """Cache the sequence's keys and values (all but the last token's, never computed) and
        hand the result over."""
        held = request.prompt + request.tokens[:-1]
        if request.versions and request.versions[0] != self.stats.weight_version:
            pass  # keys and values of older weights: never served to a later turn
        elif kv and kv[0][0].shape[-2] == len(held):
            self.prefix_cache.insert(held, kv)
        else:  # cannot happen; never cache keys that do not match their tokens
            log.error("cache length %s != %d tokens", kv[0][0].shape if kv else None, len(held))
        s = self.stats
        with self._cond:
            s.requests += 1
            if request.cached_tokens:
                s.prefix_cache_hits += 1
                s.cached_tokens += request.cached_tokens
        self._answer(request)

    def _answer(self, request: _Request) -> None:
        """Hand a generation that has ended over to its caller."""
        _resolve(
            request.future,
            GenerationResult(
                prompt_token_ids=request.prompt,
                token_ids=request.tokens,
                logprobs=request.logprobs,
                top_logprobs=request.top,
                finish_reason=request.finish_reason or "length",
                stop_reason=request.stop_reason,
                stopped_on_token=request.finish_reason == "stop",
                cached_tokens=request.cached_tokens,
                weight_version=self.stats.weight_version,
                weight_versions=request.versions,
            ),
        )
