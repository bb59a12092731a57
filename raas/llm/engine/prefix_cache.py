"""An LRU of finished sequences' keys and values, so the next turn of a rollout skips its prefill.

In a multi-turn rollout the next prompt is the previous prompt, the tokens the model generated
and the observation, so the longest cached sequence that the new prompt starts with covers all
but the observation. Sticky routing sends every turn of a rollout to the same engine for this.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from raas.llm.engine.kv import KV, prefix_view


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: bisect with C-speed slice compares
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    """``token ids -> KV`` for exactly those tokens, bounded by the total number of tokens held.

    Not thread-safe: only the engine's worker thread uses it.
    """

    def __init__(self, max_tokens: int = 32768) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], KV] = OrderedDict()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def lookup(self, prompt: Sequence[int]) -> tuple[int, KV | None]:
        """``(n, kv)``: the keys and values of ``prompt[:n]``, ``n`` the longest prefix of the
        prompt that a cached sequence shares, but at most ``len(prompt) - 1``: the last prompt
        token always goes through the model, which gives the logits of the first new token."""
        prompt = tuple(prompt)
        best, best_key = 0, None
        for key in self._entries:
            n = common_prefix_len(key, prompt)
            if n > best:
                best, best_key = n, key
        usable = min(best, len(prompt) - 1)
        if best_key is None or usable <= 0:
            return 0, None
        self._entries.move_to_end(best_key)
        return usable, prefix_view(self._entries[best_key], usable)

    def insert(self, tokens: Sequence[int], kv: KV) -> None:
        """Cache ``kv``, which must hold exactly ``tokens``; it must not be written to later."""
        key = tuple(tokens)
        if not key or len(key) > self.max_tokens:
            return
        for other in list(self._entries):
            if len(other) >= len(key) and other[: len(key)] == key:
                self._entries.move_to_end(other)  # already covered by a longer sequence
                return
            if other == key[: len(other)]:  # a shorter sequence this one extends: superseded
                self._drop(other)
        self._entries[key] = kv
        self._tokens += len(key)
        while self._tokens > self.max_tokens:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[int, ...]) -> None:
        del self._entries[key]
        self._tokens -= len(key)

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0
