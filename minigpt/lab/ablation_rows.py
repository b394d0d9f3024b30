"""What the design claims about each row of the ablation lab, written once: the report's paragraphs set it
beside what the row's runs measured (ablation_report.py)."""

from __future__ import annotations

from dataclasses import dataclass

BASELINE = "baseline"


@dataclass(frozen=True)
class Row:
    """What the design claims about one ablation, and which measurements show it (`focus`)."""

    title: str
    predicts: str
    focus: tuple[str, ...] = ()  # among: train, entropy, grads, greedy
    explains: str = ""  # what the architecture adds to the claim


ROWS = {
    BASELINE: Row("Baseline", "every piece the design defends: the causal mask, scores divided by √D = 8, "
                  "positions (rotary), residual paths around pre-norm sublayers and a final LayerNorm.",
                  ("train", "entropy", "grads", "greedy")),
    "no_causal_mask": Row(
        "No causal mask", "in training every position sees the next token, so the loss collapses towards 0 "
        "and the weights learn to copy rather than to predict; used causally, as a decoder must be, the "
        "model then fails.", ("train", "greedy")),
    "no_attn_scale": Row(
        "No 1/√D", "with head size 64 the raw scores spread 8 times wider, the softmax saturates to "
        "nearly one-hot rows, its Jacobian diag(p) - p pᵀ (every entry, not only the diagonal p(1 - p)) "
        "vanishes and W_Q, W_K stop learning.",
        ("entropy", "grads"),
        "The entropy shows the saturation; the loss pays less, because the rows whose two best scores "
        "nearly tie keep their gradient (tests/model/test_ablation_predictions.py: with unit-variance q "
        "and k the typical row's gradient is an order of magnitude smaller, the average only a few times)."),
    "integer_positions": Row(
        "Integer positions", "the index 0..63 added to every channel dwarfs the embeddings; a weight that "
        "reads it gets a gradient proportional to the position, and large inputs saturate.", (),
        "LayerNorm subtracts each token's mean over its channels before any weight reads the stream, and a "
        "value added to every channel is exactly such a mean: in a pre-norm LayerNorm model integer "
        "positions vanish before the first layer (up to rounding), so this row lands beside the next one, "
        "no positions. The predicted gradient growth is real for a layer that reads the raw sum (a "
        "post-norm first block): tests/model/test_ablation_predictions.py measures it."),
    "no_positions": Row(
        "No positional encoding", "attention alone is a weighted average that ignores order: the same "
        "tokens in another order look the same.", ("entropy",),
        "The causal mask still leaks position (query t averages over t + 1 keys), so a decoder loses less "
        "than an order-blind encoder; tests/model/test_ablation_predictions.py shows exact order "
        "blindness once the mask is gone too."),
    "no_residual": Row(
        "No residual path", "without x + Δ nothing carries x past a sublayer unchanged: every layer must "
        "rebuild the whole signal, and the gradient reaches early layers only through all later ones.",
        ("grads",)),
    "no_final_norm": Row(
        "No final norm", "the head reads the raw residual stream, whose scale is whatever the blocks "
        "made it, instead of a normalised one.", ()),
    "post_norm": Row(
        "Post-norm", "the original Transformer's norm placement, Norm(x + Sublayer(x)), normalises the skip "
        "path after every sublayer, so the stream's magnitude is reset each time, and a normalised x on the "
        "skip path loses the absolute strength of its features. Pre-norm leaves x untouched.", ("grads",),
        "At the lab's learning rate (3e-3 after 30 warmup steps) the post-norm stack falls into the unigram "
        "solution early and its first blocks then get almost no gradient; rerun with optim.lr=1e-3 "
        "optim.warmup_steps=100 it does learn, more slowly than the baseline. Post-norm needs the gentle "
        "start that pre-norm makes unnecessary (Xiong et al., 2020)."),
    "batchnorm": Row(
        "BatchNorm", "normalising each channel over the batch's tokens instead of each token over its "
        "channels ties every token to the rest of its batch: in training its output depends on the other "
        "sequences and on its own future (through the batch mean), and in eval running averages of the "
        "training batches stand in for the statistics it was trained with.", ("train",),
        "With 1,024 tokens per batch the statistics barely move from batch to batch, and every validation "
        "window has the training length, so neither failure shows at this scale; "
        "tests/model/test_why_norm.py shows both (another sequence moves a token's output, and 4x longer "
        "windows move the eval logits)."),
    "one_head": Row(
        "One head", "one head of size 128 instead of two of 64 (the same parameters): one softmax per query "
        "instead of two, so a position attends to one mixture of the earlier tokens where two heads attend "
        "to two, each free to look elsewhere.", ("entropy",),
        "Next-token prediction at this size seldom needs two things at once from one layer; "
        "tests/model/test_why_heads.py builds a target that needs three, which three heads learn and one "
        "does not."),
    "dropout": Row(
        "Dropout", "dropout (0.1 here, GPT-2's rate) makes the model spread what it knows over its units, "
        "which keeps it from memorising a small training set; a run that sees each token about once has "
        "nothing to memorise, so here it can only slow learning.", ("train",)),
    # what helps: the techniques of record-setting small-GPT runs (docs/tricks.md measures them)
    "qk_norm": Row(
        "QK-norm", "(record-setting small-GPT runs) normalising queries and keys bounds every score, so "
        "attention cannot saturate however large the weights grow, and a high learning rate stays stable.",
        ("entropy",)),
    "relu2": Row(
        "ReLU²", "(record-setting small-GPT runs) relu(x)² keeps ReLU's sparsity with a smooth start and "
        "learns faster than GELU in small GPTs (Primer, So et al., 2021).", ()),
    "zero_init_proj": Row(
        "Zero-initialised projections", "(record-setting small-GPT runs) with W_O and the FFN down "
        "projection at zero every block starts as the identity, so the untrained blocks add no noise to the "
        "residual stream.", ("grads",)),
    "value_embeds": Row(
        "Value embeddings", "(record-setting small-GPT runs) a per-layer table of token vectors added to the "
        "values gives every layer the token's identity directly, for a few lookups and no matmul.", ()),
    "smear": Row(
        "Smear", "(record-setting small-GPT runs) mixing the previous token's embedding into each token's "
        "gives the first layer the bigram context that attention would otherwise have to learn to fetch.",
        ()),
    "bigram_embed": Row(
        "Hashed bigram embedding", "(record-setting small-GPT runs) a table indexed by a hash of (previous, "
        "current) token learns bigram statistics directly, which a short run rewards.", ()),
    "logit_softcap": Row(
        "Logit soft-cap", "(record-setting small-GPT runs) 15 tanh(z / 15) bounds the logits, which keeps "
        "the output layer from growing overconfident early.", ()),
    "muon": Row(
        "Muon for the matrices", "(record-setting small-GPT runs) Muon orthogonalises the momentum of each "
        "matrix, giving every direction of an update the same step size, and learns more per step than AdamW "
        "(AdamW stays on the embeddings, the head and the norms).", ("grads",)),
    "embed_lr": Row(
        "Embedding lr", "(record-setting small-GPT runs) a token's row moves only when the token occurs, and "
        "Adam's step is about lr whatever the gradient, so the tables learn faster at a far higher lr than "
        "the matrices every token trains.", ()),
    "batch_warmup": Row(
        "Batch-size warmup", "(record-setting GPT runs) the first steps need few sequences to find a good "
        "direction, so growing the batch from a quarter buys more updates for the same FLOPs.", ("train",)),
    "seq_len_warmup": Row(
        "Sequence-length warmup", "(record-setting GPT runs) a young model cannot use a long context yet; "
        "short windows early put more of its targets where there is little to attend to, on the same "
        "tokens per step.", ("train",)),
}
