"""The GPT model: token ids in, next-token logits (and the loss) out.

    idx (B, T) -> wte (+ wpe) -> dropout -> L blocks -> ln_f -> lm_head -> logits (B, T, V)
                                                                        -> cross-entropy with targets

With the technique switches (model/config.py) the embedding may be normalised (`embed_norm`, ln_e) and get
the previous token's embedding (`smear`) and a hashed bigram row (`bigram_embed`) (previous_token.py),
layers a value-embedding table (`value_embeds`, transformer.ve.{i}, used in attention.py), the blocks
learned scalars on their input and the head a backout (`residual_scalars`, `backout`: residual_scalars.py),
and the logits a soft cap (`logit_softcap`).

Parameter names follow GPT-2 (transformer.wte / wpe / h.{i}.ln_1, attn.c_attn, attn.c_proj, ln_2,
mlp.c_fc, mlp.c_proj / ln_f, lm_head), so importing GPT-2 weights is a name-by-name copy (the
Conv1D weights of the Hugging Face checkpoint are transposed).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from minigpt.model.block import Block
from minigpt.model.chunked_loss import linear_cross_entropy
from minigpt.model.config import ModelConfig
from minigpt.model.embedding import (
    IntegerPositionalEncoding,
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
)
from minigpt.model.init import init_weights
from minigpt.model.kv_cache import KVCache
from minigpt.model.norm import build_norm
from minigpt.model.previous_token import BigramEmbedding, Smear, previous_tokens
from minigpt.model.residual_scalars import ResidualScalars
from minigpt.model.rope import RotaryEmbedding


class GPT(nn.Module):
    """A decoder-only transformer built from a validated ModelConfig (vocab_size must be set)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("GPT needs config.vocab_size; build_model(cfg, vocab_size) fills it in")
        self.config = config
        C = config.n_embd
        self.transformer = nn.ModuleDict({"wte": nn.Embedding(config.vocab_size, C)})
        if config.pos_encoding == "learned":
            self.transformer["wpe"] = LearnedPositionalEncoding(config.block_size, C)
        elif config.pos_encoding == "sinusoidal":
            self.transformer["wpe"] = SinusoidalPositionalEncoding(config.block_size, C)
        elif config.pos_encoding == "integer":  # an ablation (embedding.py)
            self.transformer["wpe"] = IntegerPositionalEncoding(config.block_size, C)
        elif config.pos_encoding == "rope":  # nothing is added to the embedding; the blocks rotate q and k
            self.transformer["rope"] = RotaryEmbedding(config.head_dim, config.block_size, config.rope_base)
        # pos_encoding=none (an ablation): no position anywhere
        norm = (config.norm, C, config.norm_eps, config.bias, config.norm_gain)  # build_norm's arguments
        if config.embed_norm:
            self.transformer["ln_e"] = build_norm(*norm)
        if config.smear:
            self.transformer["smear"] = Smear(C, config.smear_gate_channels)
        if config.bigram_embed:
            self.transformer["bigram"] = BigramEmbedding(config.bigram_embed, C)
        if config.value_embeds:
            kv_width = config.kv_heads * config.head_dim
            self.transformer["ve"] = nn.ModuleDict({str(i): nn.Embedding(config.vocab_size, kv_width)
                                                    for i in range(config.n_layer)
                                                    if config.has_value_embed(i)})
        self.transformer["drop"] = nn.Dropout(config.dropout)
        self.transformer["h"] = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        if config.residual_scalars or config.backout:
            self.transformer["scalars"] = ResidualScalars(config.n_layer, config.residual_scalars,
                                                          config.backout)
        # Post-norm blocks already end in a norm, so a final one would normalise a normalised
        # stream; pre-norm blocks leave the residual stream raw, and ln_f normalises it for the head
        # (unless the ablation model.final_norm=false removes it).
        if config.norm_placement == "pre" and config.final_norm:
            self.transformer["ln_f"] = build_norm(*norm)
        else:
            self.transformer["ln_f"] = nn.Identity()
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        # The original Transformer scales token embeddings by √C when adding the fixed sinusoidal
        # table: at init std 0.02 they would otherwise be ~35x smaller than the PE (RMS 1/√2).
        self.emb_scale = math.sqrt(C) if config.pos_encoding == "sinusoidal" else 1.0
        self.init_weights()
        if config.tie_weights:
            # one matrix both reads tokens in and scores them out: saves V·C parameters, and tokens
            # with similar embeddings get similar output scores (Press & Wolf 2017)
            self.lm_head.weight = self.transformer.wte.weight

    def init_weights(self) -> None:
        """Draw every weight as model.init says (init.py)."""
        init_weights(self, self.config)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
        last_only: bool = False,
        return_logits: bool = True,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """idx (B, T) -> logits (B, T, V), or (B, 1, V) with last_only; loss (mean cross-entropy over
        targets (B, T), -1 = ignore) or None.

        With a kv_cache, positions and the mask come from the cache, every layer writes its K/V into
        it, and the cache is advanced by T at the end: prefill with the prompt, then decode one token
        per call. last_only projects only the last position through lm_head: sampling needs nothing
        else, and the (B, T, V) logits are the largest tensor of a prefill.

        return_logits=False (with targets) is for callers that want the loss alone, like the trainer: the
        head and the loss are then fused and computed chunk by chunk (chunked_loss.py), the (B, T, V)
        logits never exist, and None is returned in their place; in float32 and under bf16/fp16 autocast
        alike (the chunk's matmuls in the autocast dtype, the softmax and the loss in float32).

        Causality: always causal, except that the ablation `model.causal=false` lifts the mask in training
        mode (`model.train()`), the mode the loss is optimised in. In eval mode (validation, sampling, every
        inspection tool) and with a KV cache the model is causal whatever its config: a decoder is used one
        token at a time and cannot see tokens it has not produced, which is where such a model fails.
        """
        B, T = idx.shape
        if last_only and targets is not None:
            raise ValueError("last_only=True computes no loss; pass targets=None")
        if not return_logits and targets is None:
            raise ValueError("return_logits=False returns the loss alone; pass targets")
        mask, is_causal = None, True
        if kv_cache is None:
            if idx.shape[1] > self.config.block_size:
                raise RuntimeError(f"sequence length {T} exceeds block_size {self.config.block_size}")
            positions = torch.arange(T, device=idx.device)  # (T,)
            is_causal = self.config.causal or not self.training  # see "Causality" above
            first_prev = None
        else:
            needed = kv_cache.length + T  # checked before a position lookup could fail less clearly
            if needed > kv_cache.max_len:
                raise RuntimeError(f"KV cache overflow: {needed} slots needed, {kv_cache.max_len} allocated")
            positions = kv_cache.positions(T)  # (T,) or (B, T) with left padding
            first_prev = None
            if self.config.reads_previous_token:
                first_prev = kv_cache.previous_tokens()  # (B,) or None
                kv_cache.record_tokens(idx)
            if positions.dim() == 2:
                # padding slots have negative positions; their outputs are never attended to, but
                # the table lookups need a valid index
                positions = positions.clamp(min=0)
            if kv_cache.length > 0 or kv_cache.has_padding:
                mask, is_causal = kv_cache.attention_mask(T), False  # (B, 1, T, S) or None

        x = self.embed_tokens(idx, first_prev, positions)  # (B, T, C)
        if self.emb_scale != 1.0:
            x = x * self.emb_scale
        rope = None
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(positions)  # (T, C) or (B, T, C) broadcasts over B
        elif "rope" in self.transformer:
            rope = self.transformer.rope(positions)  # (cos, sin), shared by all layers
        x = self.transformer.drop(x)
        ve = dict(self.transformer.ve.items()) if "ve" in self.transformer else {}  # layer -> its table
        scalars = self.transformer.scalars if "scalars" in self.transformer else None
        x0, x_mid = x, None  # the embedding, which residual_scalars mixes back in; the stream after mid_layer
        for i, block in enumerate(self.transformer.h):
            if scalars is not None:
                x = scalars.block_input(i, x, x0)  # (B, T, C)
            table = ve.get(str(i))
            x = block(x, rope=rope, mask=mask, is_causal=is_causal, kv_cache=kv_cache,
                      value_embed=None if table is None else table(idx))  # (B, T, C)
            if scalars is not None and i == scalars.mid_layer:
                x_mid = x
        if kv_cache is not None:
            kv_cache.advance(T)
        if scalars is not None:
            x = scalars.head_input(x, x_mid)  # (B, T, C)
        x = self.transformer.ln_f(x)
        cap = self.config.logit_softcap
        if not return_logits:
            return None, linear_cross_entropy(x, self.lm_head.weight, targets, softcap=cap)
        if last_only:
            x = x[:, -1:, :]  # (B, 1, C)
        logits = self.lm_head(x)  # (B, T, V) or (B, 1, V)
        if cap:
            logits = cap * torch.tanh(logits / cap)  # (B, T, V) in (-cap, cap)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def embed_tokens(self, idx: torch.Tensor, first_prev: torch.Tensor | None,
                     positions: torch.Tensor) -> torch.Tensor:
        """idx (B, T) -> (B, T, C): the token embedding, with the previous-token switches (previous_token.py).
        first_prev: (B,) the token before idx[:, 0], or None; positions: (T,) or (B, T), 0 (or clamped
        padding) where a token has no previous one."""
        x = self.token_rows(idx)  # (B, T, C)
        if not self.config.reads_previous_token:
            return x
        prev = previous_tokens(idx, first_prev, positions > 0)  # (B, T), -1 where there is none
        if "smear" in self.transformer:
            known = (prev >= 0).unsqueeze(-1).to(x.dtype)  # (B, T, 1)
            x_prev = self.token_rows(prev.clamp(min=0)) * known  # (B, T, C), zero where there is none
            x = self.transformer.smear(x, x_prev)
        if "bigram" in self.transformer:
            x = x + self.transformer.bigram(prev, idx)  # (B, T, C)
        return x

    def token_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, T) -> (B, T, C): the rows of `wte`, normalised with model.embed_norm (ln_e)."""
        x = self.transformer.wte(idx)  # (B, T, C)
        return self.transformer.ln_e(x) if "ln_e" in self.transformer else x

    @torch.no_grad()
    def attention_probs(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """idx (B, T) -> one (B, H, T, T) tensor of attention probabilities per layer (math backend)."""
        attns = [block.attn for block in self.transformer.h]
        try:
            for attn in attns:
                attn.record_probs = True
            self(idx)
            return [attn.probs for attn in attns]
        finally:
            for attn in attns:
                attn.record_probs, attn.probs = False, None

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count (tied weights counted once). non_embedding drops the lookup tables (wpe, wte unless
        it is tied to lm_head, whose matmul does real work, the value-embedding and bigram tables)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            tables = {id(m.weight): m.weight for m in self.modules() if isinstance(m, nn.Embedding)}
            tables.pop(id(self.lm_head.weight), None)  # tied: the head's matmul reads it
            n -= sum(w.numel() for w in tables.values())
        return n

    def flops_per_token(self) -> int:
        """Forward + backward FLOPs per trained token at full context (PaLM, appendix B):
        6 per matmul weight (2 forward, 4 backward) plus 12·L·C·T for the attention scores and the
        weighted sum of values, T = block_size."""
        cfg = self.config
        return 6 * self.num_params(non_embedding=True) + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size

    def new_kv_cache(
        self,
        batch_size: int,
        max_len: int | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> KVCache:
        """An empty KVCache for this model; max_len (default block_size) slots, the model's dtype/device."""
        cfg = self.config
        max_len = cfg.block_size if max_len is None else max_len
        if max_len > cfg.block_size:
            # positions past block_size were never trained (and learned PE has no row for them)
            raise ValueError(f"max_len={max_len} exceeds the model's block_size={cfg.block_size}")
        weight = self.transformer.wte.weight  # float in every weights_dtype (int8 quantises linears only)
        return KVCache.allocate(
            cfg.n_layer, batch_size, cfg.kv_heads, max_len, cfg.head_dim,
            dtype=dtype or weight.dtype, device=device or weight.device,
        )
