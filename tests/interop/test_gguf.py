"""GGUF export: read back with the `gguf` package's own reader, the file holds our tensors (named and laid out
as llama.cpp expects, checked against an explicit table here) and metadata; the 16-bit types round as their
formats say and q8_0 stays within its error bound; what llama.cpp cannot compute is refused in one line."""

from __future__ import annotations

import errno
from pathlib import Path

import gguf
import numpy as np
import pytest
import tiktoken
import torch
from cli_helpers import run_script, snapshot
from interop_helpers import SHAPES, make_checkpoint, save_model, small_bpe, wide_model
from model_helpers import tiny_config

from minigpt.data.tokenizers import ByteTokenizer, CharTokenizer, TiktokenTokenizer
from minigpt.errors import UserError
from minigpt.interop.gguf_export import export_gguf, interleave_rope_rows
from minigpt.model.ffn import ffn_hidden_size
from minigpt.model.rope import RotaryEmbedding, apply_rope


def with_pattern(tok: TiktokenTokenizer, pattern: str) -> TiktokenTokenizer:
    """The same ranks and specials, split by another pattern."""
    enc = tok.encoding
    return TiktokenTokenizer("bpe", tiktoken.Encoding(f"{enc.name}-split", pat_str=pattern,
                                                      mergeable_ranks=enc._mergeable_ranks,
                                                      special_tokens=enc._special_tokens))


def _fields(reader: gguf.GGUFReader) -> dict:
    return {name: field.contents() for name, field in reader.fields.items()}


def _tensors(reader: gguf.GGUFReader) -> dict[str, tuple[str, np.ndarray]]:
    """name -> (type, float32 values in (out, in) layout), dequantised by gguf itself."""
    return {t.name: (t.tensor_type.name, gguf.quants.dequantize(t.data, t.tensor_type))
            for t in reader.tensors}


def _interleaved(rows: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The rows llama.cpp's adjacent-pair RoPE needs, written out: within each head of D rows, row 2i is our
    row i and row 2i+1 our row D/2 + i."""
    D = rows.shape[0] // n_heads
    order = [h * D + (j // 2 if j % 2 == 0 else D // 2 + j // 2) for h in range(n_heads) for j in range(D)]
    return rows[order]


def _expected(model) -> dict[str, torch.Tensor]:
    """Every tensor llama.cpp reads, from our weights by name (the table the exporter must reproduce)."""
    cfg, sd = model.config, model.state_dict()
    H, H_kv, D = cfg.n_head, cfg.kv_heads, cfg.head_dim
    llama = cfg.pos_encoding == "rope"  # the llama or arcee graph, or qwen3's, which rotates halves as we do

    def rope_rows(rows: torch.Tensor, heads: int) -> torch.Tensor:
        return rows if cfg.qk_norm else _interleaved(rows, heads)

    def ours(name: str) -> torch.Tensor:  # GPT-2 without biases is written with zero biases
        return sd.get(name, torch.zeros(sd[name.replace(".bias", ".weight")].shape[0]))

    out = {"token_embd.weight": sd["transformer.wte.weight"],
           "output_norm.weight": sd["transformer.ln_f.weight"]}
    if not cfg.tie_weights:
        out["output.weight"] = sd["lm_head.weight"]
    if not llama:
        out |= {"position_embd.weight": sd["transformer.wpe.weight"],
                "output_norm.bias": ours("transformer.ln_f.bias")}
    kinds = ("weight", "bias") if cfg.bias or not llama else ("weight",)
    for i in range(cfg.n_layer):
        p, b = f"transformer.h.{i}.", f"blk.{i}."
        out |= {b + "attn_norm.weight": sd[p + "ln_1.weight"], b + "ffn_norm.weight": sd[p + "ln_2.weight"]}
        if cfg.qk_norm:
            out |= {b + "attn_q_norm.weight": sd[p + "attn.q_norm.weight"],
                    b + "attn_k_norm.weight": sd[p + "attn.k_norm.weight"]}
        for k in kinds:
            out |= {f"{b}attn_output.{k}": ours(f"{p}attn.c_proj.{k}"),
                    f"{b}ffn_down.{k}": ours(f"{p}mlp.c_proj.{k}")}
            if llama:
                q, key, v = ours(f"{p}attn.c_attn.{k}").split([H * D, H_kv * D, H_kv * D])
                out |= {f"{b}attn_q.{k}": rope_rows(q, H), f"{b}attn_k.{k}": rope_rows(key, H_kv),
                        f"{b}attn_v.{k}": v}
                if cfg.activation == "relu2":  # arcee: down(relu(up x)²), no gate
                    out[f"{b}ffn_up.{k}"] = ours(f"{p}mlp.c_fc.{k}")
                else:
                    gate, up = ours(f"{p}mlp.c_fc.{k}").split(ffn_hidden_size(cfg))
                    out |= {f"{b}ffn_gate.{k}": gate, f"{b}ffn_up.{k}": up}
            else:
                out |= {f"{b}attn_qkv.{k}": ours(f"{p}attn.c_attn.{k}"),
                        f"{b}ffn_up.{k}": ours(f"{p}mlp.c_fc.{k}"),
                        f"{b}attn_norm.{k}": ours(f"{p}ln_1.{k}"), f"{b}ffn_norm.{k}": ours(f"{p}ln_2.{k}")}
    return out


@pytest.mark.parametrize("shape", SHAPES)
def test_the_file_holds_our_tensors_and_metadata(tmp_path: Path, shape: str) -> None:
    _, model = make_checkpoint(tmp_path / "ckpt", shape)
    out = export_gguf(model, small_bpe(), tmp_path / "m.gguf", "f32", name="minigpt-test")
    reader = gguf.GGUFReader(out)
    tensors, expected = _tensors(reader), _expected(model)
    assert sorted(tensors) == sorted(expected)
    for name, want in expected.items():
        kind, got = tensors[name]
        assert kind == "F32" and got.shape == tuple(want.shape) and np.array_equal(got, want.numpy()), name
    cfg, fields = model.config, _fields(reader)
    rope_arch = "qwen3" if cfg.qk_norm else "arcee" if cfg.activation == "relu2" else "llama"
    arch = rope_arch if cfg.pos_encoding == "rope" else "gpt2"
    assert fields["general.architecture"] == arch and fields["general.name"] == "minigpt-test"
    assert fields["general.file_type"] == gguf.LlamaFileType.ALL_F32
    sizes = {"context_length": cfg.block_size, "embedding_length": cfg.n_embd, "block_count": cfg.n_layer,
             "feed_forward_length": ffn_hidden_size(cfg), "attention.head_count": cfg.n_head}
    if arch != "gpt2":
        sizes |= {"attention.head_count_kv": cfg.kv_heads, "rope.freq_base": cfg.rope_base,
                  "rope.dimension_count": cfg.head_dim, "attention.layer_norm_rms_epsilon": cfg.norm_eps}
    else:
        sizes |= {"attention.layer_norm_epsilon": cfg.norm_eps}
    for key, value in sizes.items():
        assert fields[f"{arch}.{key}"] == pytest.approx(value, rel=1e-6), key  # f32 fields round 1e-6
    tok = small_bpe()
    tokens = fields["tokenizer.ggml.tokens"]
    assert len(tokens) == cfg.vocab_size and tokens[tok.eot_id] == "<|endoftext|>"
    assert tokens[:3] == ["Ā", "ā", "Ă"]  # bytes 0, 1, 2 in GPT-2's byte alphabet
    assert tokens[tok.vocab_size:] == [f"[PAD{i}]" for i in range(tok.vocab_size, cfg.vocab_size)]
    types = fields["tokenizer.ggml.token_type"]
    assert types[tok.eot_id] == gguf.TokenType.CONTROL and types[0] == gguf.TokenType.NORMAL
    assert len(fields["tokenizer.ggml.merges"]) >= tok.vocab_size - 257
    assert (fields["tokenizer.ggml.model"], fields["tokenizer.ggml.pre"]) == ("gpt2", "llama-bpe")
    assert fields["tokenizer.ggml.bos_token_id"] == fields["tokenizer.ggml.eos_token_id"] == tok.eot_id
    assert fields["tokenizer.ggml.add_bos_token"] is False


@pytest.mark.parametrize("shape", ["gpt2_block", "odd_llama"])
def test_16_bit_and_q8_0_files_round_as_their_formats_say(tmp_path: Path, shape: str) -> None:
    _, model = make_checkpoint(tmp_path / "ckpt", shape)
    expected = _expected(model)
    for gguf_type in ("f16", "bf16", "q8_0"):
        path = export_gguf(model, small_bpe(), tmp_path / f"{gguf_type}.gguf", gguf_type, "t")
        reader = gguf.GGUFReader(path)
        for name, (kind, got) in _tensors(reader).items():
            want = expected[name]
            if want.dim() == 1 or name == "position_embd.weight":  # norms, biases, GPT-2's position table
                assert kind == "F32" and np.array_equal(got, want.numpy()), name
            elif gguf_type == "f16" or (gguf_type == "q8_0" and want.shape[1] % 32):  # q8_0's fallback
                assert kind == "F16" and np.array_equal(got, want.half().float().numpy()), name
            elif gguf_type == "bf16":
                assert kind == "BF16" and np.array_equal(got, want.bfloat16().float().numpy()), name
            else:  # blocks of 32 int8 with an f16 scale amax/127: each value within about half a step
                assert kind == "Q8_0", name
                blocks = want.reshape(-1, 32)
                step = blocks.abs().amax(dim=1, keepdim=True) / 127
                error = (torch.from_numpy(got).reshape(-1, 32) - blocks).abs()
                assert (error <= 0.57 * step + 1e-7).all(), name
                assert error.max() > 0  # it did quantise


def test_interleaved_rows_make_adjacent_pair_rope_compute_rotate_half() -> None:
    """What llama.cpp computes (pairs 2i, 2i+1 rotated by angle p·θ_i) on the exported rows equals minigpt's
    rotate-half RoPE on the original rows, so every q·k score is unchanged."""
    torch.manual_seed(0)
    H, D, C, T = 3, 8, 12, 10
    w_q, w_k, x = torch.randn(H * D, C), torch.randn(H * D, C), torch.randn(T, C)
    cos, sin = RotaryEmbedding(D, T)(torch.arange(T))  # (T, D/2)

    def heads(w):
        return (x @ w.T).view(T, H, D).transpose(0, 1)  # (H, T, D)

    def adjacent_pairs(v):  # llama.cpp's rope: (v_2i, v_2i+1) -> rotation by the angle of frequency i
        even, odd = v[..., 0::2], v[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    ours = apply_rope(heads(w_q), cos, sin) @ apply_rope(heads(w_k), cos, sin).transpose(-1, -2)
    q, k = heads(interleave_rope_rows(w_q, H)), heads(interleave_rope_rows(w_k, H))
    theirs = adjacent_pairs(q) @ adjacent_pairs(k).transpose(-1, -2)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)


def test_what_llama_cpp_cannot_compute_is_refused(tmp_path: Path) -> None:
    gelu = wide_model(tiny_config(n_layer=1, n_head=2, n_embd=32, block_size=16, activation="gelu"), 300)
    with pytest.raises(UserError, match=r"model\.activation=gelu has no GGUF equivalent"):
        export_gguf(gelu, small_bpe(), tmp_path / "a.gguf", "f32", "t")
    demo = wide_model(SHAPES["demo"], 300)
    with pytest.raises(UserError, match="tokenizer byte has no merges"):
        export_gguf(demo, ByteTokenizer(), tmp_path / "b.gguf", "f32", "t")
    with pytest.raises(UserError, match="tokenizer char-3 is no byte-level BPE"):
        export_gguf(demo, CharTokenizer(["a", "b", "c"]), tmp_path / "c.gguf", "f32", "t")
    odd = with_pattern(small_bpe(), r"\S+|\s+")
    with pytest.raises(UserError, match="no llama.cpp pre-tokenizer"):
        export_gguf(demo, odd, tmp_path / "d.gguf", "f32", "t")
    assert list(tmp_path.iterdir()) == []


def test_the_script_refuses_in_one_line_and_leaves_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    ckpt, _ = make_checkpoint(tmp_path / "ckpt", "demo")
    post = wide_model(tiny_config(n_layer=1, n_head=2, n_embd=32, block_size=16, norm_placement="post"), 512)
    ablated = wide_model(tiny_config(n_layer=1, n_head=2, n_embd=32, block_size=16, attn_scale="none"), 512)
    save_model(tmp_path / "post", post, small_bpe())
    save_model(tmp_path / "ablated", ablated, small_bpe())
    before = snapshot(tmp_path)
    cases = [([f"checkpoint={tmp_path / 'post'}"], "model.norm_placement=post has no GGUF equivalent"),
             ([f"checkpoint={tmp_path / 'ablated'}"], "model.attn_scale=none is an ablation"),
             ([f"checkpoint={ckpt}", "gguf_type=q4_0"], "gguf_type='q4_0' is not one of")]
    for args, message in cases:
        run = run_script("export", [*args, "format=gguf", f"out={tmp_path / 'm.gguf'}"], capsys)
        assert run.code == 2 and len(run.err_lines) == 1 and message in run.err, run.err

    def disk_full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", disk_full)
    run = run_script("export", [f"checkpoint={ckpt}", "format=gguf", f"out={tmp_path / 'm.gguf'}"], capsys)
    assert run.code == 2 and "nothing exported" in run.err and "No space left" in run.err, run.err
    assert snapshot(tmp_path) == before  # not even a temporary file
