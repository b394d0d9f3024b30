"""The key/value cache: what lets decoding feed one token per step.

Every layer's keys and values for all positions seen so far are kept in preallocated buffers, so a
decode step only computes K/V for the new token and attends over the rest. Nothing is reallocated or
concatenated per step: new K/V are written in place into the next slots (`index_copy_`), and attention
reads a view of the filled slots.

Each layer has a buffer of its own, rather than one (L, ...) tensor seen through per-layer views. Under
torch.compile the difference is large: a write into a view of a tensor shared by all layers is turned
into a copy of that whole tensor, every layer of every step, while a write into a tensor of its own
stays an in-place write of the new slots (tests/model/test_kv_cache.py counts the bytes each compiled
kernel touches).

Rows of a batch may hold prompts of different lengths. They are left-padded: row b's real
tokens start at slot `pad[b]`; slots before that are never attended to, and row b's token in
slot s has position s - pad[b]. So each row sees exactly what it would see if it were alone.

`length` is a plain int, the same for every row. Under torch.compile it becomes a symbolic size
(`torch.compile(..., dynamic=True)`), so one compiled decode step serves every length. The buffers hold one
slot more than the `max_len` a cache may fill: a view of the filled slots is then never the whole buffer,
a case torch.compile would otherwise tell apart with a graph of its own, compiled the first time a
generation reaches the end of its context.
"""

from __future__ import annotations

import torch


class KVCache:
    """Per-layer K/V buffers, `k[l]` and `v[l]` of shape (B, H_kv, T_max + 1, D), filled up to `length` slots
    (at most T_max = `max_len`; the last slot is never used, see the module docstring), and `tokens`
    (B, T_max + 1), the token id in each slot. `KVCache.allocate` makes an empty one."""

    def __init__(self, k: list[torch.Tensor], v: list[torch.Tensor], tokens: torch.Tensor,
                 length: int = 0) -> None:
        self.k, self.v = k, v
        self.device, self.dtype = k[0].device, k[0].dtype
        self.max_len = k[0].shape[2] - 1
        self.length = length  # slots filled, the same for every row (rows differ only in padding)
        B = k[0].shape[0]
        self.pad = torch.zeros(B, dtype=torch.long, device=self.device)  # (B,) leading invalid slots
        # models that read the previous token (model/previous_token.py) need the last one at the start of
        # each decode step
        self.tokens = tokens
        self.has_padding = False  # a Python flag, so the common unpadded case needs no mask and no sync

    @classmethod
    def allocate(
        cls,
        n_layer: int,
        batch_size: int,
        n_kv_head: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> KVCache:
        """An empty cache with zeroed buffers for `max_len` slots (one more allocated: module docstring)."""
        shape = (batch_size, n_kv_head, max_len + 1, head_dim)
        k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layer)]
        return cls(k, v, torch.zeros((batch_size, max_len + 1), dtype=torch.long, device=device))

    @property
    def batch_size(self) -> int:
        return self.pad.shape[0]

    def set_padding(self, pad: torch.Tensor) -> None:
        """Declare per-row left padding, (B,) ints. Call on an empty cache, before the prefill."""
        if self.length:
            raise RuntimeError("padding can only be set on an empty cache")
        self.pad = pad.to(device=self.pad.device, dtype=torch.long)
        self.has_padding = bool((self.pad > 0).any())

    def positions(self, t_new: int) -> torch.Tensor:
        """Positions of the next `t_new` tokens: (T,) without padding, else (B, T)."""
        slots = torch.arange(self.length, self.length + t_new, device=self.device)  # (T,)
        if not self.has_padding:
            return slots
        return slots.unsqueeze(0) - self.pad.unsqueeze(1)  # (B, T)

    def attention_mask(self, t_new: int) -> torch.Tensor | None:
        """Boolean mask (B, 1, T, length + T), True where a query may attend; None when none is needed.

        A single decoded token with no padding attends to every filled slot, so it needs no mask.
        """
        if not self.has_padding and t_new == 1:
            return None
        q_slot = torch.arange(self.length, self.length + t_new, device=self.device)  # (T,)
        k_slot = torch.arange(self.length + t_new, device=self.device)  # (S,)
        causal = k_slot.unsqueeze(0) <= q_slot.unsqueeze(1)  # (T, S)
        valid = k_slot.unsqueeze(0) >= self.pad.unsqueeze(1)  # (B, S)
        # A padding query has no valid key: a fully masked row would softmax to NaN, and NaN K/V in
        # the padding slots would then leak into real rows as 0 * NaN. Letting it attend to itself
        # keeps every value finite; real queries never see padding either way.
        itself = k_slot.unsqueeze(0) == q_slot.unsqueeze(1)  # (T, S)
        return (causal.unsqueeze(0) & (valid.unsqueeze(1) | itself.unsqueeze(0))).unsqueeze(1)  # (B, 1, T, S)

    def update(
        self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write (B, H_kv, T, D) keys/values into the next slots; return all filled K/V (B, H_kv, S, D)."""
        t_new = k_new.shape[2]
        end = self.length + t_new
        if end > self.max_len:
            raise RuntimeError(f"KV cache overflow: {end} slots needed, {self.max_len} allocated")
        slots = torch.arange(self.length, end, device=self.device)  # (T,)
        self.k[layer].index_copy_(2, slots, k_new)
        self.v[layer].index_copy_(2, slots, v_new)
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def record_tokens(self, idx: torch.Tensor) -> None:
        """Write the (B, T) token ids of this forward call into the next slots (before `advance`)."""
        self.tokens[:, self.length : self.length + idx.shape[1]] = idx

    def previous_tokens(self) -> torch.Tensor | None:
        """(B,) the token in the last filled slot of each row, or None for an empty cache."""
        # a slice, not an integer index: under torch.compile an index by the length would specialise the
        # graph on it and recompile at every step
        return self.tokens[:, self.length - 1 : self.length].squeeze(1) if self.length else None

    def advance(self, t_new: int) -> None:
        """Mark `t_new` more slots filled. The model calls this once per forward, after the last layer."""
        self.length += t_new

    def rewind(self, length: int) -> None:
        """Keep only the first `length` slots (speculative decoding drops the K/V of rejected tokens this way:
        the slots after them are simply overwritten by the next writes)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot rewind a cache of {self.length} slots to {length}")
        self.length = length

    def reset(self) -> None:
        """Empty the cache (for a re-prefill) without reallocating it."""
        self.length = 0
        self.pad.zero_()
        self.has_padding = False
