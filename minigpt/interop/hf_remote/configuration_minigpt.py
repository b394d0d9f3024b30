"""The configuration of a minigpt model exported to Hugging Face with its own modeling code: the sizes and
switches of minigpt's ModelConfig that a rotary, pre-norm model can have. Loaded by transformers with
`trust_remote_code=True`; it imports nothing of minigpt."""

from transformers import PretrainedConfig


class MiniGPTConfig(PretrainedConfig):
    model_type = "minigpt"

    def __init__(self, vocab_size=4096, n_layer=4, n_head=3, n_kv_head=1, n_embd=96, block_size=128,
                 norm="rmsnorm", norm_eps=1e-5, norm_gain=True, activation="swiglu", ffn_hidden=256,
                 bias=False, rope_base=10000.0, qk_norm=False, value_embeds=False, value_embed_every=1,
                 smear=False, bigram_embed=0, embed_norm=False, residual_scalars=False, backout=False,
                 logit_softcap=0.0, qk_scale=1.0, ve_gate_max=2.0, ve_gate_channels=0, smear_gate_channels=0,
                 tie_word_embeddings=False, **kwargs):
        self.vocab_size, self.n_layer, self.n_head, self.n_kv_head = vocab_size, n_layer, n_head, n_kv_head
        self.n_embd, self.block_size, self.norm, self.norm_eps = n_embd, block_size, norm, norm_eps
        self.norm_gain, self.activation, self.ffn_hidden, self.bias = norm_gain, activation, ffn_hidden, bias
        self.rope_base, self.qk_norm, self.value_embeds = rope_base, qk_norm, value_embeds
        self.value_embed_every, self.smear, self.bigram_embed = value_embed_every, smear, bigram_embed
        self.embed_norm, self.residual_scalars, self.backout = embed_norm, residual_scalars, backout
        self.logit_softcap, self.qk_scale, self.ve_gate_max = logit_softcap, qk_scale, ve_gate_max
        self.ve_gate_channels = ve_gate_channels or n_embd  # 0: every channel
        self.smear_gate_channels = smear_gate_channels or n_embd
        self.max_position_embeddings = block_size
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
