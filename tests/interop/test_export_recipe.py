"""The recipe model (configs/model/recipe.yaml: value embeddings, smear, residual scalars, backout, soft-cap,
gainless norms, QK-norm scaled, ReLU²) through the real `scripts/export.py`: format=hf writes minigpt's own
modeling code, says so and why in its one line, and transformers (trust_remote_code=True) computes the
trained model's logits (within 1e-4) and greedy tokens, its tokenizer our ids; format=gguf and the families
that cannot compute it are refused in one line naming the switches, writing nothing."""

from __future__ import annotations

import dataclasses
import errno
import json
from pathlib import Path

import pytest
import torch
from cli_helpers import run_script, snapshot
from interop_helpers import make_checkpoint, save_model, small_bpe, stdlib_texts
from model_helpers import fit, load_preset

from minigpt.checkpoint.load import load_model
from minigpt.errors import UserError
from minigpt.interop.hf_export import hf_family
from minigpt.model.factory import build_model
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

transformers = pytest.importorskip("transformers")

# the recipe's every switch at a test size: 4 layers (value embeddings on 1 and 3, the backout at 2), 3 heads
RECIPE = dataclasses.replace(load_preset("recipe"), n_embd=48, block_size=64)
SWITCHES = ("model.value_embeds=true", "model.smear=true", "model.logit_softcap=15.0",
            "model.norm_gain=false", "model.embed_norm=true", "model.residual_scalars=true",
            "model.backout=true", "model.qk_scale=1.2", "model.activation=relu2 with model.qk_norm=true")


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    """A checkpoint of the recipe trained 30 steps (seeded) on standard-library source: its scalars, gates and
    zero-initialised projections have moved off their starting values."""
    tok = small_bpe()
    torch.manual_seed(0)
    model = build_model(RECIPE, tok.vocab_size)
    ids = torch.tensor(tok.encode("\n".join(stdlib_texts()))[:20_000])
    T, g = RECIPE.block_size, torch.Generator().manual_seed(0)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, len(ids) - T - 1, (4,), generator=g)
        windows = torch.stack([ids[s:s + T + 1] for s in starts])  # (4, T + 1)
        return windows[:, :-1], windows[:, 1:]

    fit(model, batch, steps=30, lr=1e-2)
    assert model.transformer.scalars.backout.item() != 0.2  # init=fan_in starts it at 0.2
    return save_model(tmp_path_factory.mktemp("recipe") / "ckpt", model.eval(), tok)


def test_the_recipe_exports_its_own_modeling_code_that_transformers_runs(recipe, tmp_path, capsys):
    out = tmp_path / "hf"
    done = run_script("export", [f"checkpoint={recipe}", "format=hf", f"out={out}"], capsys)
    assert done.code == 0, done.err
    line = done.out.strip()
    assert line.startswith(f"exported to {out}: MiniGPTForCausalLM") and "trust_remote_code=True" in line
    assert all(switch in line for switch in SWITCHES), line
    assert json.loads((out / "generation_config.json").read_text())["use_cache"] is False

    model, tokenizer, _ = load_model(recipe, "cpu")
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True,
                                                            local_files_only=True).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out, trust_remote_code=True,
                                                              local_files_only=True)
    text = stdlib_texts()[0]
    assert hf_tokenizer(text)["input_ids"] == tokenizer.encode(text)
    idx = torch.randint(0, tokenizer.vocab_size, (3, RECIPE.block_size),
                        generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(idx)[0]
        torch.testing.assert_close(hf(idx).logits, ours, atol=1e-4, rtol=0)
    assert ours.std() > 0.5  # not two near-zero tensors

    prompt = tokenizer.encode("def decode(self, s):\n")
    expected = generate(model, [prompt], max_new_tokens=30, params=SamplingParams(temperature=0.0),
                        generator=torch.Generator().manual_seed(0)).tokens[0]
    with torch.no_grad():  # the folder's generation_config: no KV cache, which the code does not keep
        theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False, eos_token_id=None)
    assert theirs[0, len(prompt):].tolist() == expected and len(set(expected)) > 3


def test_what_cannot_carry_the_recipe_refuses_in_one_line_and_writes_nothing(recipe, tmp_path, capsys):
    demo = make_checkpoint(tmp_path / "demo", "demo")[0]
    before = snapshot(tmp_path, recipe)
    out = tmp_path / "x"
    cases = [
        (["format=gguf", f"out={out}.gguf"], [*SWITCHES, "have no GGUF equivalent", "format=hf",
                                              "train model=demo"]),
        (["format=hf", "hf_family=llama", f"out={out}"],
         ["hf_family=llama: LlamaForCausalLM does not compute", *SWITCHES, "hf_family=custom"]),
        (["format=hf", "hf_family=arcee", f"out={out}"], ["ArceeForCausalLM does not compute"]),
        (["format=gguf", "hf_family=custom", f"out={out}"], ["hf_family=custom applies only to format=hf"]),
        (["format=hf", "hf_family=onnx", f"out={out}"], ["hf_family='onnx' is not one of"]),
    ]
    for args, needles in cases:
        run = run_script("export", [f"checkpoint={recipe}", *args], capsys)
        assert run.code == 2 and len(run.err_lines) == 1 and run.err.startswith("error: "), run.err
        assert all(n in run.err for n in needles) and "Traceback" not in run.err, (args, run.err)
    run = run_script("export", [f"checkpoint={demo}", "hf_family=qwen3", f"out={out}"], capsys)
    assert run.code == 2 and "LlamaForCausalLM does (hf_family=llama)" in run.err, run.err
    assert snapshot(tmp_path, recipe) == before


def test_a_llama_model_exports_as_custom_code_when_asked(tmp_path, capsys):
    ckpt, model = make_checkpoint(tmp_path / "demo", "demo")
    out = tmp_path / "hf"
    done = run_script("export", [f"checkpoint={ckpt}", "hf_family=custom", f"out={out}"], capsys)
    assert done.code == 0 and "as hf_family=custom asks (hf_family=llama needs no custom code)" in done.out
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True,
                                                            local_files_only=True).eval()
    idx = torch.randint(0, small_bpe().vocab_size, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx)[0], atol=1e-4, rtol=0)


def test_a_failed_write_of_the_code_leaves_nothing(recipe, tmp_path, capsys, monkeypatch):
    """The disk fills up while the modeling code is written, after the weights: one line naming the file under
    `out`, and neither the folder nor its temporary is left."""
    def disk_full(file: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(file))

    monkeypatch.setattr("minigpt.interop.hf_export.write_text", disk_full)
    before = snapshot(tmp_path)
    out = tmp_path / "out" / "hf"
    run = run_script("export", [f"checkpoint={recipe}", f"out={out}"], capsys)
    assert run.code == 2 and len(run.err_lines) == 1, run.err
    assert f"nothing exported: cannot write {out}/configuration_minigpt.py: No space left" in run.err
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("overrides", "family", "named"), [
    ({}, "llama", "LlamaForCausalLM, which transformers loads with no custom code"),
    ({"activation": "relu2"}, "arcee", "ArceeForCausalLM"),
    ({"norm": "layernorm", "activation": "gelu"}, "custom",
     "computes model.norm=layernorm, model.activation=gelu"),
    ({"pos_encoding": "learned", "smear": True}, None,
     "model.pos_encoding=learned has no Hugging Face equivalent in minigpt's own modeling code"),
    ({"norm_placement": "post"}, None, "model.norm_placement=post has no Hugging Face equivalent: GPT-2 and "
                                       "Llama blocks are pre-norm"),
])
def test_the_family_is_chosen_or_the_model_refused_naming_why(overrides, family, named):
    cfg = dataclasses.replace(load_preset("demo"), **overrides)
    if family is None:
        with pytest.raises(UserError) as refused:
            hf_family(cfg)
        assert str(refused.value).startswith(named)
    else:
        assert hf_family(cfg)[0] == family and named in hf_family(cfg)[1]
