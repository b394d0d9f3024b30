"""What bfloat16 and int8 weights cost a trained model in accuracy: its logits, greedy tokens and val loss
against its own float32 self, loaded as `generate weights_dtype=...` loads it (generation/decoder.py).

The model is a trained checkpoint (`make train`'s newest run under outputs/train, unless one is given):
random weights would say nothing about what rounding does to predictions a model has learned. For each
weights dtype, against float32:

    logit error       max and mean |logit - float32 logit| over every position of `windows` val windows,
                      and the max relative to the float32 logits' standard deviation
    greedy agreement  over `new_tokens` tokens greedily decoded by float32 after each of `prompts` val
                      prompts: the share of steps where the dtype's argmax, given float32's tokens so far,
                      is float32's token (what a greedy draft of that dtype would have accepted), and the
                      first step where the dtype's own greedy continuation differs
    val loss          nats per token over the val split (up to `max_tokens`), scored as scripts/evaluate.py
                      scores it (inspect/perplexity.py), with its bits per byte
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from minigpt.checkpoint.load import find_latest_checkpoint, read_checkpoint
from minigpt.data.sources import load_corpus
from minigpt.fast.int8 import quantize_for_decoding
from minigpt.inspect.perplexity import document_tokens, recorded_corpus, sliding_window_loss
from minigpt.lab.bench.generation import minigpt_generate
from minigpt.model.gpt import GPT
from minigpt.sampling.next_token import greedy


def _dtypes(model: GPT) -> dict[str, GPT]:
    return {"fp32": model, "bf16": copy.deepcopy(model).bfloat16(),
            "int8": quantize_for_decoding(copy.deepcopy(model))[0]}


@torch.no_grad()
def _greedy_agreement(models: dict[str, GPT], prompts: list[list[int]], new_tokens: int) -> dict[str, dict]:
    out = {name: {"agreement": 0.0, "first_divergence": []} for name in models if name != "fp32"}
    for prompt in prompts:
        want = minigpt_generate(models["fp32"], prompt, new_tokens)
        seq = torch.tensor([prompt + want])  # (1, P + N)
        for name, row in out.items():
            model = models[name]
            window = model.config.block_size  # teacher-forced in windows, as the decoder's context would be
            hits = 0
            for i, token in enumerate(want):
                end = len(prompt) + i
                logits, _ = model(seq[:, max(0, end - window) : end], last_only=True)  # (1, 1, V)
                hits += int(greedy(logits[0, -1])) == token
            row["agreement"] += hits / (len(want) * len(prompts))
            own = minigpt_generate(model, prompt, new_tokens)
            differ = (i for i, (a, b) in enumerate(zip(own, want, strict=True)) if a != b)
            row["first_divergence"].append(next(differ, new_tokens))
    return out


def bench_decode_accuracy(checkpoint: str | Path | None = None, *, windows: int = 16, prompts: int = 4,
                          new_tokens: int = 256, max_tokens: int | None = None) -> dict:
    """See the module docstring. Returns {"skipped": why} where no trained checkpoint is found."""
    try:
        ckpt = Path(checkpoint) if checkpoint is not None else find_latest_checkpoint(Path("outputs"))
    except Exception as e:  # noqa: BLE001 (a UserError with the fix: train one)
        return {"skipped": str(e)}
    model, tokenizer, meta = read_checkpoint(ckpt)
    model.eval()
    data = recorded_corpus(meta)
    texts = [d.text for d in load_corpus(data, Path(data.cache_dir)).documents("val")]
    tokens = document_tokens(texts, tokenizer)
    if max_tokens is not None:
        tokens = tokens[:max_tokens]
    models = _dtypes(model)
    block = model.config.block_size
    starts = torch.linspace(0, len(tokens) - block - 1, windows).long().tolist()
    batch = torch.stack([tokens[s : s + block] for s in starts])  # (windows, block)
    result = {"checkpoint": str(ckpt), "model": {k: getattr(model.config, k) for k in
                                                ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")}}
    with torch.no_grad():
        want, _ = models["fp32"](batch)  # (windows, block, V)
        for name, m in models.items():
            if name == "fp32":
                continue
            got, _ = m(batch)
            err = (got.float() - want).abs()
            result.setdefault("logits", {})[name] = {
                "max_abs": err.max().item(), "mean_abs": err.mean().item(),
                "max_over_std": (err.max() / want.std()).item()}
    eot = tokenizer.eot_id
    doc_starts = [i for i, t in enumerate(tokens.tolist()) if t == eot][:prompts]
    prompt_ids = [tokens[s : s + 16].tolist() for s in doc_starts]
    result["greedy"] = _greedy_agreement(models, prompt_ids, new_tokens)
    result["new_tokens"] = new_tokens
    byte_lengths = tokenizer.token_byte_lengths()
    result["val"] = {}
    for name, m in models.items():
        score = sliding_window_loss(m, tokens, token_bytes=byte_lengths)
        result["val"][name] = {"loss": score.loss, "bpb": score.bpb, "tokens": score.tokens}
    return result
