"""Key/value caches the engine owns: rows of a batch, left-padded, grown in place.

transformers' ``DynamicLayer`` appends with ``torch.cat``, which copies the whole cache on every
decoded token. :class:`KVLayer` keeps spare capacity and writes new keys and values in place, so a
decode step costs what attention costs. A batch is a :class:`KVCache` whose rows are right-aligned:
row ``i`` holds ``lengths[i]`` real positions at the end, zeros (masked out) before them.

Only full-attention models are supported (no sliding windows, no linear attention layers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

# Keys and values of every layer for some rows: ``[(keys, values), ...]``, each
# ``[batch, kv_heads, length, head_dim]``.
KV = list[tuple[torch.Tensor, torch.Tensor]]

GROW_TOKENS = 64  # spare positions added whenever a layer runs out


class KVLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A full-attention layer cache that appends in place into spare capacity."""

    def __init__(self, spare: int = GROW_TOKENS) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._spare = max(spare, 0)
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._len = 0

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor, spare: int) -> KVLayer:
        layer = cls(spare)
        layer._alloc(keys, keys.shape[-2] + layer._spare)
        layer._write(keys, values)
        return layer

    @classmethod
    def adopt(cls, keys: torch.Tensor, values: torch.Tensor, length: int, spare: int) -> KVLayer:
        """Take over buffers whose first ``length`` positions are filled (the rest is capacity)."""
        layer = cls(spare)
        layer._k, layer._v, layer._len = keys, values, length
        layer.dtype, layer.device = keys.dtype, keys.device
        layer.is_initialized = True
        layer.keys, layer.values = keys[:, :, :length], values[:, :, :length]
        return layer

    def _alloc(self, like: torch.Tensor, capacity: int) -> None:
        b, h, _, d = like.shape
        k = like.new_zeros((b, h, capacity, d))
        v = like.new_zeros((b, h, capacity, d))
        if self._k is not None and self._v is not None and self._len:
            k[:, :, : self._len] = self._k[:, :, : self._len]
            v[:, :, : self._len] = self._v[:, :, : self._len]
        self._k, self._v = k, v
        self.dtype, self.device = like.dtype, like.device
        self.is_initialized = True

    def _write(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        assert self._k is not None and self._v is not None
        n = keys.shape[-2]
        self._k[:, :, self._len : self._len + n] = keys
        self._v[:, :, self._len : self._len + n] = values
        self._len += n
        self.keys = self._k[:, :, : self._len]
        self.values = self._v[:, :, : self._len]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self._alloc(key_states, key_states.shape[-2] + self._spare)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = key_states.shape[-2]
        if self._k is None:
            self.lazy_initialization(key_states, value_states)
        elif self._len + n > self._k.shape[-2]:
            self._alloc(key_states, self._len + n + max(self._spare, GROW_TOKENS))
        self._write(key_states, value_states)
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._len

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the engine rebuilds caches instead of cropping them")


class KVCache(Cache):
    """One :class:`KVLayer` per model layer."""

    def __init__(self, layers: Sequence[KVLayer]) -> None:
        self.kv_layers = list(layers)
        super().__init__(layers=list(self.kv_layers))

    @classmethod
    def empty(cls, num_layers: int, spare: int = GROW_TOKENS) -> KVCache:
        return cls([KVLayer(spare) for _ in range(num_layers)])

    @classmethod
    def holding(cls, kv: KV, spare: int = GROW_TOKENS) -> KVCache:
        """A cache that starts with (a copy of) ``kv``."""
        return cls([KVLayer.holding(k, v, spare) for k, v in kv])

    @property
    def length(self) -> int:
        return self.kv_layers[0].get_seq_length() if self.kv_layers else 0

    def tensors(self) -> KV:
        """Views of the filled part of every layer (valid until the next update)."""
        out: KV = []
        for layer in self.kv_layers:
            assert layer.keys is not None and layer.values is not None
            out.append((layer.keys, layer.values))
        return out


def row_view(kv: KV, row: int, length: int) -> KV:
    """The last ``length`` positions of one row, as views."""
    out: KV = []
    for k, v in kv:
        start = k.shape[-2] - length
        out.append((k[row : row + 1, :, start:], v[row : row + 1, :, start:]))
    return out


def prefix_view(kv: KV, length: int) -> KV:
    """The first ``length`` positions of a one-row cache, as views."""
    return [(k[:, :, :length], v[:, :, :length]) for k, v in kv]


def clone(kv: KV) -> KV:
    """A compact copy that keeps no larger tensor alive."""
    return [(k.clone(), v.clone()) for k, v in kv]


def assemble(rows: Sequence[KV], lengths: Sequence[int], spare: int = GROW_TOKENS) -> KVCache:
    """Stack one-row caches into a batch, right-aligned: row ``i`` ends at the common length."""
    total = max(lengths)
    layers: list[KVLayer] = []
    for layer_idx in range(len(rows[0])):
        k0 = rows[0][layer_idx][0]
        b, h, d = len(rows), k0.shape[1], k0.shape[-1]
        keys = k0.new_zeros((b, h, total + spare, d))
        values = k0.new_zeros((b, h, total + spare, d))
        for i, (row, n) in enumerate(zip(rows, lengths, strict=True)):
            k, v = row[layer_idx]
            keys[i, :, total - n : total] = k[0, :, k.shape[-2] - n :]
            values[i, :, total - n : total] = v[0, :, v.shape[-2] - n :]
        layers.append(KVLayer.adopt(keys, values, total, spare))
    return KVCache(layers)
