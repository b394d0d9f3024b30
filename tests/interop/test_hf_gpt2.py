"""Importing GPT-2: a randomly initialised Hugging Face GPT2LMHeadModel, saved locally, must load into minigpt
and compute the same logits and the same greedy tokens (transformers is the independent reference)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from model_helpers import tiny_config
from safetensors.torch import load_file, save_file

from minigpt.checkpoint.load import load_model
from minigpt.data.tokenizers import ByteTokenizer
from minigpt.errors import UserError
from minigpt.interop.hf_export import export_hf
from minigpt.interop.hf_gpt2 import hf_config_from_model, hf_state_dict, load_hf_gpt2
from minigpt.interop.hf_import import import_hf
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

transformers = pytest.importorskip("transformers")

VOCAB, CTX = 261, 32  # above the byte tokenizer's 257, so a saved checkpoint can carry that tokenizer


def _hf_model(**overrides) -> transformers.GPT2LMHeadModel:
    """HF's default activation (gelu_new); weights re-drawn wide, so a wrong mapping shows in the logits."""
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=CTX, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0,
        **overrides,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> tuple[Path, transformers.GPT2LMHeadModel]:
    folder = tmp_path_factory.mktemp("hf_gpt2")
    model = _hf_model()
    model.save_pretrained(folder)
    return folder, model


def test_logits_match_transformers(hf_folder) -> None:
    folder, hf = hf_folder
    ours = load_hf_gpt2(folder)
    assert ours.config.activation == "gelu_tanh" and ours.config.block_size == CTX
    idx = torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(idx).logits
        logits, _ = ours(idx)
    assert expected.std() > 0.3  # the comparison is not between two near-zero tensors
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


def test_greedy_kv_cached_generation_matches_transformers(hf_folder) -> None:
    folder, hf = hf_folder
    ours = load_hf_gpt2(folder)
    prompt = [5, 17, 42, 99, 3]
    with torch.no_grad():
        expected = hf.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, use_cache=True,
            pad_token_id=0, eos_token_id=None,
        )[0, len(prompt):].tolist()  # fmt: skip
    result = generate(
        ours, [prompt], max_new_tokens=12, params=SamplingParams(temperature=0.0),
        generator=torch.Generator().manual_seed(0), use_cache=True,
    )  # fmt: skip
    assert result.tokens[0] == expected


def test_bare_gpt2model_checkpoint_and_pytorch_bin(tmp_path: Path, hf_folder) -> None:
    """The original `gpt2` upload has no `transformer.` prefix, no lm_head and old mask buffers."""
    folder, hf = hf_folder
    sd = load_file(str(folder / "model.safetensors"))
    bare = {k.removeprefix("transformer."): v for k, v in sd.items() if k != "lm_head.weight"}
    bare["h.0.attn.bias"] = torch.ones(1, 1, CTX, CTX)  # a causal-mask buffer, not a weight
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    torch.save(bare, tmp_path / "pytorch_model.bin")
    ours = load_hf_gpt2(tmp_path)
    idx = torch.arange(10).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, atol=1e-4, rtol=1e-4)


def test_hf_state_dict_gives_transformers_the_same_weights(hf_folder) -> None:
    ours = load_hf_gpt2(hf_folder[0])
    fresh = transformers.GPT2LMHeadModel(transformers.GPT2Config(**hf_config_from_model(ours.config))).eval()
    fresh.load_state_dict(hf_state_dict(ours))
    idx = torch.arange(12).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(fresh(idx).logits, ours(idx)[0], atol=1e-4, rtol=1e-4)


def test_checkpoint_round_trip_through_both_formats(tmp_path: Path, hf_folder) -> None:
    tok_dir = tmp_path / "tok"
    ByteTokenizer().save(tok_dir)
    ckpt = import_hf(hf_folder[0], tmp_path / "ckpt", tokenizer_dir=tok_dir)
    model, tokenizer, meta = load_model(ckpt, "cpu")
    assert tokenizer.kind == "byte" and meta["model_config"]["activation"] == "gelu_tanh"
    out = export_hf(model, tokenizer, tmp_path / "hf_out")
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == tokenizer.eot_id
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    idx = torch.arange(16).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(idx).logits, hf_folder[1](idx).logits, atol=1e-4, rtol=1e-4)
    assert transformers.AutoTokenizer.from_pretrained(out)("é<|endoftext|>")["input_ids"] == (
        tokenizer.encode("é<|endoftext|>"))  # the byte tokenizer travelled too
    with pytest.raises(UserError, match="already exists"):
        export_hf(model, tokenizer, out)


def test_bad_inputs_are_user_errors(tmp_path: Path, hf_folder) -> None:
    with pytest.raises(UserError, match="no config.json"):
        load_hf_gpt2(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "activation_function": "swish"}))
    with pytest.raises(UserError, match="activation_function"):
        load_hf_gpt2(tmp_path)
    (tmp_path / "config.json").write_text((hf_folder[0] / "config.json").read_text())
    with pytest.raises(UserError, match="no model.safetensors"):
        load_hf_gpt2(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        load_hf_gpt2(tmp_path)
    (tmp_path / "config.json").write_text((hf_folder[0] / "config.json").read_text())
    sd = load_file(str(hf_folder[0] / "model.safetensors"))
    sd["transformer.wpe.weight"] = sd["transformer.wpe.weight"][:-1].contiguous()  # a context mismatch
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match="transformer.wpe.weight has shape"):
        load_hf_gpt2(tmp_path)


def test_export_refuses_what_gpt2_cannot_express() -> None:
    from minigpt.model.factory import build_model

    cfg = tiny_config(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=20, norm="rmsnorm")
    model = build_model(cfg)
    with pytest.raises(UserError, match="model.norm=rmsnorm"):
        hf_state_dict(model)


def test_a_model_without_biases_exports_as_gpt2_with_zero_biases() -> None:
    from minigpt.model.factory import build_model

    model = build_model(tiny_config(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=20, bias=False))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    sd = hf_state_dict(model)
    assert torch.equal(sd["transformer.h.1.mlp.c_fc.bias"], torch.zeros(64)) and "lm_head.bias" not in sd
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**hf_config_from_model(model.config))).eval()
    hf.load_state_dict(sd)
    idx = torch.arange(8).unsqueeze(0)
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model.eval()(idx)[0], atol=1e-5, rtol=1e-5)
