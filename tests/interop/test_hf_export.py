"""Hugging Face export: the folder reloads with transformers alone (offline, no custom code) as
GPT2LMHeadModel, LlamaForCausalLM or Qwen3ForCausalLM, computes our logits (fp32, within 1e-5) and decodes our
100 greedy tokens; it imports back to the same model; nothing existing is overwritten and a failed export
leaves nothing behind.

Llama's rotary tables: transformers computes cos/sin in float32 (position · frequency rounded to float32),
minigpt in float64 then rounds; at position 127 they differ by ~4e-6, which deep layers amplify to ~1e-4 in
logits of std 2. So the logits are compared with transformers' own tables copied into our model (the mapping
alone), and the greedy tokens with each library's own tables (everything).
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch
from cli_helpers import run_script, snapshot
from interop_helpers import LLAMA_SHAPES, SHAPES, make_checkpoint, small_bpe

from minigpt.checkpoint.load import load_model
from minigpt.errors import UserError
from minigpt.interop import staging
from minigpt.interop.hf_export import export_hf
from minigpt.interop.hf_import import import_hf
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

transformers = pytest.importorskip("transformers")

GREEDY_TOKENS = 100
CLASSES = {"gpt2_block": "GPT2LMHeadModel", "odd_gpt2": "GPT2LMHeadModel", "demo": "LlamaForCausalLM",
           "odd_llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "arcee": "ArceeForCausalLM"}


def _use_transformers_rope_tables(model, hf) -> None:
    """Copy transformers' float32 cos/sin tables into our RotaryEmbedding (both rotate-half: first halves)."""
    T = model.config.block_size
    cos, sin = hf.model.rotary_emb(torch.zeros(1, T, 1), torch.arange(T)[None])  # (1, T, D) each
    half = model.config.head_dim // 2
    rope = model.transformer.rope
    assert (cos[0, :, :half] - rope.cos).abs().max() < 1e-5  # the same tables up to float32 arithmetic
    rope.cos.copy_(cos[0, :, :half])
    rope.sin.copy_(sin[0, :, :half])


def _ours_greedy(model, prompt: list[int], n: int) -> list[int]:
    result = generate(model, [prompt], max_new_tokens=n, params=SamplingParams(temperature=0.0),
                      generator=torch.Generator().manual_seed(0))
    return result.tokens[0]


@pytest.mark.parametrize("shape", SHAPES)
def test_transformers_reloads_the_folder_with_our_logits_and_greedy_tokens(tmp_path: Path, shape: str):
    _, model = make_checkpoint(tmp_path / "ckpt", shape)
    out = export_hf(model, small_bpe(), tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert type(hf).__name__ == CLASSES[shape]
    assert hf.dtype == torch.float32
    T = model.config.block_size
    idx = torch.randint(0, small_bpe().vocab_size, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf(idx).logits
        own_tables = model(idx)[0]
        if shape in LLAMA_SHAPES:
            _use_transformers_rope_tables(model, hf)
        ours = model(idx)[0]
    assert theirs.shape == ours.shape and ours.std() > 0.5  # not two near-zero tensors
    assert (theirs - ours).abs().max().item() <= 1e-5
    assert (theirs - own_tables).abs().max().item() <= (1e-3 if shape in LLAMA_SHAPES else 1e-5)
    model = make_checkpoint(tmp_path / "again", shape)[1]  # minigpt's own rotary tables again

    prompt = small_bpe().encode("def decode(self, s):\n")
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=GREEDY_TOKENS, do_sample=False,
                               eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert len(expected) == GREEDY_TOKENS and len(set(expected)) > 5  # a real sequence, not one token
    assert _ours_greedy(model, prompt, GREEDY_TOKENS) == expected


def test_the_folder_holds_the_configs_transformers_reads(tmp_path: Path) -> None:
    _, model = make_checkpoint(tmp_path / "ckpt", "odd_llama")
    out = export_hf(model, small_bpe(), tmp_path / "hf")
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json"]
    config = transformers.AutoConfig.from_pretrained(out, local_files_only=True)
    cfg = model.config
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (6, 2, 10)
    assert config.rope_parameters["rope_theta"] == 500.0 and config.rms_norm_eps == 1e-6
    assert config.tie_word_embeddings and config.attention_bias and config.mlp_bias
    assert (config.vocab_size, config.max_position_embeddings) == (cfg.vocab_size, cfg.block_size)
    generation = transformers.GenerationConfig.from_pretrained(out, local_files_only=True)
    eot = small_bpe().eot_id
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == (eot, eot, eot)


@pytest.mark.parametrize("shape", ["gpt2_block", "odd_gpt2", *LLAMA_SHAPES])
def test_export_then_import_is_a_round_trip(tmp_path: Path, shape: str) -> None:
    _, model = make_checkpoint(tmp_path / "ckpt", shape)
    back = import_hf(export_hf(model, small_bpe(), tmp_path / "hf"), tmp_path / "back")
    again, tokenizer, meta = load_model(back, "cpu")
    assert tokenizer.name == small_bpe().name and meta["imported_from"] == str((tmp_path / "hf").resolve())
    idx = torch.arange(40).unsqueeze(0) * 7 % small_bpe().vocab_size
    with torch.no_grad():
        assert torch.equal(again(idx)[0], model(idx)[0])  # the same weights, the same arithmetic
    for text in ("def f(x):\n    return x\n", "<|endoftext|> stays text"):
        assert tokenizer.encode(text) == small_bpe().encode(text)


def test_existing_output_is_never_overwritten(tmp_path: Path) -> None:
    ckpt, model = make_checkpoint(tmp_path / "ckpt", "demo")
    out = tmp_path / "hf"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match="already exists"):
        export_hf(model, small_bpe(), out)
    with pytest.raises(UserError, match="already exists"):
        import_hf(tmp_path / "anything", ckpt)  # the checkpoint folder itself
    assert snapshot(tmp_path) == before


def test_a_failed_export_leaves_nothing_behind(tmp_path: Path, monkeypatch) -> None:
    """A full disk while the weights are written: one line, and neither the folder nor its temporary."""
    _, model = make_checkpoint(tmp_path / "ckpt", "gpt2_block")

    def disk_full(file, tensors):
        raise OSError(errno.ENOSPC, "No space left on device", str(file))

    monkeypatch.setattr("minigpt.interop.hf_export.write_weights", disk_full)
    before = snapshot(tmp_path)
    out = tmp_path / "out" / "hf"
    written = f"nothing exported: cannot write {out}/model.safetensors: No space left"
    with pytest.raises(UserError, match=written):
        export_hf(model, small_bpe(), out)
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()


def test_staged_output_refuses_a_file_that_appeared_meanwhile(tmp_path: Path) -> None:
    out = tmp_path / "model.gguf"
    with pytest.raises(UserError, match="appeared while"), staging.staged_output(out, folder=False) as tmp:
        tmp.write_bytes(b"new")
        out.write_bytes(b"someone else's")
    assert out.read_bytes() == b"someone else's" and list(tmp_path.iterdir()) == [out]


def test_the_export_and_import_scripts(tmp_path: Path, capsys) -> None:
    """The real command lines: a round trip, then bad input in one line each, with nothing written."""
    ckpt, model = make_checkpoint(tmp_path / "ckpt", "demo")
    done = run_script("export", [f"checkpoint={ckpt}", "format=hf", f"out={tmp_path / 'hf'}"], capsys)
    summary = f"exported to {tmp_path / 'hf'}: LlamaForCausalLM, which transformers loads with no custom code"
    assert done.code == 0 and done.out.strip() == summary, done.err
    done = run_script("import_hf", [f"source={tmp_path / 'hf'}", f"out={tmp_path / 'back'}"], capsys)
    assert done.code == 0 and done.out.strip() == f"imported to {tmp_path / 'back'}", done.err
    assert json.loads((tmp_path / "back" / "meta.json").read_text())["model_config"]["n_kv_head"] == 1
    before = snapshot(tmp_path)
    bad = {
        "export": [([f"checkpoint={ckpt}", "format=onnx", f"out={tmp_path / 'x'}"], "format='onnx'"),
                   ([f"checkpoint={ckpt}"], "out= is required"),
                   ([f"checkpoint={ckpt}", "gguf_type=f16", f"out={tmp_path / 'x'}"], "only to format=gguf"),
                   ([f"checkpoint={ckpt}", f"out={tmp_path / 'hf'}"], "already exists"),
                   ([f"checkpoint={tmp_path / 'none'}", f"out={tmp_path / 'x'}"], "does not exist")],
        "import_hf": [([f"out={tmp_path / 'x'}"], "source= is required"),
                      ([f"source={tmp_path / 'ckpt'}", f"out={tmp_path / 'x'}"], "has no config.json")],
    }
    for script, cases in bad.items():
        for args, message in cases:
            run = run_script(script, args, capsys)
            assert run.code == 2 and len(run.err_lines) == 1 and message in run.err, (args, run.err)
            assert run.err.startswith("error: ") and "Traceback" not in run.err
    assert snapshot(tmp_path) == before
