"""A minigpt model for transformers, with its technique switches: the forward pass of minigpt's GPT written
out again with torch alone, for a folder that `AutoModelForCausalLM.from_pretrained(folder,
trust_remote_code=True)` loads. The parameter names are minigpt's own, so the weights are a plain copy.

    ids -> wte (-> norm with embed_norm) (+ smear, + bigram row) = x0
        -> L pre-norm blocks, block i reading a_i x + b_i x0 (residual_scalars)
           attention: fused q|k|v, values + gated value-embedding rows, QK-norm, rotary, causal softmax
           MLP: swiglu | relu2 | relu | gelu | gelu_tanh
        -> minus c times the stream after block L // 2 (backout) -> final norm -> head (-> cap tanh(./cap))

No KV cache: every call runs the whole sequence (generation passes use_cache=False), which these small
models afford. Left padding is read from the attention mask: positions count from each row's first token.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_minigpt import MiniGPTConfig

HASH_MULTIPLIER = 1_000_003  # the bigram table's hash: (previous * this + current) mod rows


class Norm(nn.Module):
    """RMSNorm or LayerNorm over the last dimension, with a learned gain (and LayerNorm's bias) or none."""

    def __init__(self, config: MiniGPTConfig, width: int, gain: bool) -> None:
        super().__init__()
        self.kind, self.eps = config.norm, config.norm_eps
        self.weight = nn.Parameter(torch.ones(width)) if gain else None
        if gain and config.norm == "layernorm" and config.bias:
            self.bias = nn.Parameter(torch.zeros(width))
        else:
            self.bias = None

    def forward(self, x):
        if self.kind == "layernorm":
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
        return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)


def rotate(x, cos, sin):
    """(B, H, T, D) heads rotated pairwise, dimension j with j + D/2, by the angles of their positions."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: MiniGPTConfig, layer: int) -> None:
        super().__init__()
        self.H, self.H_kv, self.D = config.n_head, config.n_kv_head, config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, (self.H + 2 * self.H_kv) * self.D, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        if config.qk_norm:
            self.q_norm = Norm(config, self.D, config.norm_gain)
            self.k_norm = Norm(config, self.D, config.norm_gain)
        if has_value_embed(config, layer):
            self.ve_gate = nn.Linear(config.ve_gate_channels, self.H_kv, bias=False)
        self.qk_norm, self.qk_scale, self.config = config.qk_norm, config.qk_scale, config

    def forward(self, x, cos, sin, mask, value_embed):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split([self.H * self.D, self.H_kv * self.D, self.H_kv * self.D], dim=2)
        q = q.view(B, T, self.H, self.D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.H_kv, self.D).transpose(1, 2)  # (B, H_kv, T, D)
        v = v.view(B, T, self.H_kv, self.D).transpose(1, 2)
        if value_embed is not None:  # v + m sigmoid(x W_g) e[token], one gate per key/value head
            gate = torch.sigmoid(self.ve_gate(x[..., :self.config.ve_gate_channels]))  # (B, T, H_kv)
            gate = self.config.ve_gate_max * gate.transpose(1, 2).unsqueeze(-1)  # (B, H_kv, T, 1)
            v = v + gate * value_embed.view(B, T, self.H_kv, self.D).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q) * self.qk_scale, self.k_norm(k) * self.qk_scale
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        grouped = self.H_kv != self.H  # grouped-query attention: H / H_kv query heads per key/value head
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: MiniGPTConfig) -> None:
        super().__init__()
        self.activation = config.activation
        gated = 2 if config.activation == "swiglu" else 1
        self.c_fc = nn.Linear(config.n_embd, gated * config.ffn_hidden, bias=config.bias)
        self.c_proj = nn.Linear(config.ffn_hidden, config.n_embd, bias=config.bias)

    def forward(self, x):
        h = self.c_fc(x)
        if self.activation == "swiglu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif self.activation == "relu2":
            h = F.relu(h).square()
        elif self.activation == "relu":
            h = F.relu(h)
        else:
            h = F.gelu(h, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return self.c_proj(h)


class Block(nn.Module):
    def __init__(self, config: MiniGPTConfig, layer: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = Norm(config, config.n_embd, config.norm_gain), Norm(config, config.n_embd,
                                                                                   config.norm_gain)
        self.attn, self.mlp = Attention(config, layer), MLP(config)

    def forward(self, x, cos, sin, mask, value_embed):
        x = x + self.attn(self.ln_1(x), cos, sin, mask, value_embed)
        return x + self.mlp(self.ln_2(x))


class Smear(nn.Module):
    def __init__(self, config: MiniGPTConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(config.smear_gate_channels, 1, bias=False)
        self.lam = nn.Parameter(torch.zeros(1))


class Bigram(nn.Module):
    def __init__(self, config: MiniGPTConfig) -> None:
        super().__init__()
        self.table = nn.Embedding(config.bigram_embed, config.n_embd)


class Scalars(nn.Module):
    def __init__(self, config: MiniGPTConfig) -> None:
        super().__init__()
        if config.residual_scalars:
            self.resid = nn.Parameter(torch.ones(config.n_layer))
            self.x0 = nn.Parameter(torch.zeros(config.n_layer))
        if config.backout:
            self.backout = nn.Parameter(torch.zeros(1))


def has_value_embed(config: MiniGPTConfig, layer: int) -> bool:
    """Every value_embed_every-th layer counted back from the last has a value-embedding table."""
    return config.value_embeds and (config.n_layer - 1 - layer) % config.value_embed_every == 0


class MiniGPTForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = MiniGPTConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["Block"]
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}  # used where tie_word_embeddings

    def __init__(self, config: MiniGPTConfig) -> None:
        super().__init__(config)
        C, D = config.n_embd, config.n_embd // config.n_head
        parts = {"wte": nn.Embedding(config.vocab_size, C),
                 "h": nn.ModuleList(Block(config, i) for i in range(config.n_layer)),
                 "ln_f": Norm(config, C, config.norm_gain)}
        if config.embed_norm:
            parts["ln_e"] = Norm(config, C, config.norm_gain)
        if config.smear:
            parts["smear"] = Smear(config)
        if config.bigram_embed:
            parts["bigram"] = Bigram(config)
        if config.value_embeds:
            parts["ve"] = nn.ModuleDict({str(i): nn.Embedding(config.vocab_size, config.n_kv_head * D)
                                         for i in range(config.n_layer) if has_value_embed(config, i)})
        if config.residual_scalars or config.backout:
            parts["scalars"] = Scalars(config)
        self.transformer = nn.ModuleDict(parts)
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.transformer.wte

    def get_output_embeddings(self):
        return self.lm_head

    def rows(self, ids):
        x = self.transformer.wte(ids)  # (B, T, C)
        return self.transformer.ln_e(x) if "ln_e" in self.transformer else x

    def embed(self, ids, has_previous):
        """ids (B, T) -> (B, T, C): token rows, the smear and the bigram row (none at a row's first token)."""
        x = self.rows(ids)
        prev = torch.cat([ids[:, :1], ids[:, :-1]], dim=1)  # (B, T): the token before, where there is one
        if "smear" in self.transformer:
            smear = self.transformer.smear
            x_prev = self.rows(prev) * has_previous.unsqueeze(-1)
            gate = torch.sigmoid(smear.gate(x[..., :smear.gate.in_features]))  # (B, T, 1)
            x = x + smear.lam * gate * x_prev
        if "bigram" in self.transformer:
            table = self.transformer.bigram.table
            x = x + table((prev * HASH_MULTIPLIER + ids) % table.num_embeddings) * has_previous.unsqueeze(-1)
        return x

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        B, T = input_ids.shape
        valid = torch.ones_like(input_ids, dtype=bool) if attention_mask is None else attention_mask.bool()
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)  # (B, T): each row counts from its first token
        D = self.config.n_embd // self.config.n_head
        # float64: positions times small frequencies keep their digits
        inv_freq = self.config.rope_base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
        inv_freq = inv_freq.to(positions.device)
        angles = positions.unsqueeze(-1).double() * inv_freq  # (B, T, D/2)
        cos, sin = (t.float().unsqueeze(1) for t in (angles.cos(), angles.sin()))  # (B, 1, T, D/2)
        causal = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()
        eye = torch.eye(T, dtype=torch.bool, device=input_ids.device)
        mask = ((causal & valid[:, None, :]) | eye).unsqueeze(1)  # (B, 1, T, T); padding sees itself
        x = self.embed(input_ids, positions > 0)
        parts = dict(self.transformer.items())
        scalars, tables = parts.get("scalars"), dict(parts["ve"].items()) if "ve" in parts else {}
        x0, x_mid, mid = x, None, self.config.n_layer // 2
        for i, block in enumerate(self.transformer.h):
            if scalars is not None and hasattr(scalars, "resid"):
                x = scalars.resid[i] * x + scalars.x0[i] * x0
            table = tables.get(str(i))
            x = block(x, cos, sin, mask, None if table is None else table(input_ids))
            x_mid = x if i == mid else x_mid
        if scalars is not None and hasattr(scalars, "backout"):
            x = x - scalars.backout * x_mid
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, V)
        cap = self.config.logit_softcap
        if cap:
            logits = cap * torch.tanh(logits / cap)
        loss = None
        if labels is not None:
            shifted = logits[:, :-1].reshape(-1, logits.shape[-1])  # position t predicts label t + 1
            loss = F.cross_entropy(shifted, labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)
