"""Speculative decoding (generation/speculative.py) gives the model's own outputs: greedy token for token
(with window rebuilds, drafts of another context size, stop tokens), and sampled tokens with the model's
exact distribution, checked by a chi-square test against distributions computed from full forwards."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from minigpt.generation.speculative import accept_or_resample, speculative_stream_tokens
from minigpt.model.config import ModelConfig
from minigpt.model.factory import build_model
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams
from minigpt.sampling.sequences import GenerationStats

GREEDY = SamplingParams(0.0)


def _model(seed: int, vocab: int = 64, block: int = 16, std: float = 0.3, **overrides) -> torch.nn.Module:
    """Sharp random weights (see tests/sampling/test_decode.py), so every token depends on its context."""
    cfg = dict(n_layer=2, n_head=4, n_embd=32, block_size=block, vocab_size=vocab, dropout=0.0)
    model = build_model(ModelConfig(**{**cfg, **overrides}))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


def _speculative(model, draft, prompt, n, params=GREEDY, k=3, seed=0, **kw):
    stats = GenerationStats()
    steps = list(speculative_stream_tokens(model, draft, prompt, max_new_tokens=n, params=params,
                                           generator=torch.Generator().manual_seed(seed), num_draft_tokens=k,
                                           stats=stats, **kw))
    return [s.emitted[0] for s in steps if s.emitted[0] is not None], [s.logits for s in steps], stats


@pytest.mark.parametrize("k", [1, 3, 7])
@pytest.mark.parametrize("draft_block", [16, 6])  # the draft's own context: smaller, rebuilt more often
def test_greedy_is_the_models_own_greedy_output(k: int, draft_block: int) -> None:
    model = _model(1)
    drafts = {"another model": _model(2, block=draft_block, n_layer=1), "the model itself": model}
    plain = generate(model, [[3, 1, 4]], max_new_tokens=45, params=GREEDY, generator=torch.Generator(),
                     keep_logits=True)  # 45 tokens: well past the 16-token context, windows rebuilt
    for name, draft in drafts.items():
        if draft is model and draft_block != 16:
            continue
        tokens, logits, stats = _speculative(model, draft, [3, 1, 4], 45, k=k)
        assert tokens == plain.tokens[0], name
        for got, want in zip(logits, plain.logits, strict=True):
            torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
        assert stats.reprefills == plain.stats.reprefills > 0 and stats.new_tokens == 45
        assert stats.accepted + stats.rounds == 45  # each round emits its accepted drafts and one more
        if draft is model:  # a perfect draft: every proposal accepted
            assert stats.accepted == stats.drafted > 0


def test_stop_tokens_and_the_token_budget_end_it_as_plain_decoding() -> None:
    model, draft = _model(3), _model(4, n_layer=1)
    free, _, _ = _speculative(model, draft, [5, 6], 12)
    stop = free[5]
    tokens, _, stats = _speculative(model, draft, [5, 6], 12, stop_ids=[stop])
    assert tokens == free[: free.index(stop)] and stats.new_tokens == len(tokens)
    assert len(_speculative(model, model, [5, 6], 7, k=4)[0]) == 7  # a round never overshoots the budget
    assert _speculative(model, draft, [5, 6], 0)[0] == []


def test_the_acceptance_rule_leaves_the_models_distribution() -> None:
    """One round's rule on fixed p and q: the first emitted token is distributed as p[0]."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])  # (k+1, V), k = 1
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4]])  # (k, V): a draft that favours what p does not
    counts = torch.zeros(4)
    n = 20000
    for _ in range(n):
        d = int(torch.multinomial(q[0], 1, generator=g))
        accepted, token = accept_or_resample(p, q, [d], g)
        counts[d if accepted else token] += 1
    assert chi_square_p_value(counts, n * p[0]) > 1e-3


def chi_square_p_value(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """P(X >= the statistic) for X chi-square with (cells - 1) degrees of freedom: the regularised upper
    incomplete gamma Q(dof / 2, stat / 2)."""
    stat = ((observed - expected) ** 2 / expected).sum().double()
    dof = torch.tensor(observed.numel() - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))


@torch.no_grad()
def _exact_two_token_distribution(model, prompt: list[int], params: SamplingParams) -> torch.Tensor:
    """p(t1, t2 | prompt) = p(t1 | prompt) p(t2 | prompt, t1), from full uncached forwards: (V, V)."""
    from minigpt.sampling.next_token import probabilities

    first = probabilities(model(torch.tensor([prompt]))[0][0, -1], params)  # (V,)
    rows = [probabilities(model(torch.tensor([prompt + [t]]))[0][0, -1], params) for t in range(len(first))]
    return first.unsqueeze(1) * torch.stack(rows)  # (V, V)


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.8, top_k=4)],
                         ids=["T=1", "T=0.8,k=4"])
def test_sampled_tokens_have_the_models_distribution(params: SamplingParams) -> None:
    """Many independent two-token continuations: their joint distribution, by chi-square, is the model's."""
    vocab, prompt, n = 6, [1, 2], 1200
    model = _model(5, vocab=vocab, n_layer=1, n_embd=16, n_head=2)
    draft = copy.deepcopy(model)  # a perturbed copy: right about half of the time
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(9)) * 0.2)
    exact = _exact_two_token_distribution(model, prompt, params)
    counts = torch.zeros(vocab, vocab)
    rates = []
    for seed in range(n):
        tokens, _, stats = _speculative(model, draft, prompt, 2, params=params, k=2, seed=seed)
        counts[tokens[0], tokens[1]] += 1
        rates.append(stats.acceptance_rate)
    keep = exact.flatten() * n >= 5  # the chi-square approximation wants >= 5 expected per cell
    observed, expected = counts.flatten()[keep], exact.flatten()[keep] * n
    rare_observed, rare_expected = n - observed.sum(), n - expected.sum()
    pooled = bool(rare_expected > 1e-3)  # the rare cells pooled into one (top-k can leave none: 0/0)
    if pooled:
        observed = torch.cat([observed, rare_observed.reshape(1)])
        expected = torch.cat([expected, rare_expected.reshape(1)])
    else:
        assert rare_observed == 0  # no pair outside the top-k ones is ever drawn
    assert chi_square_p_value(observed, expected) > 1e-3
    assert 0.05 < sum(rates) / len(rates) < 0.95  # the draft is neither always right nor always wrong
    # and the test can tell: the draft's own distribution is rejected
    draft_exact = _exact_two_token_distribution(draft, prompt, params)
    wrong = draft_exact.flatten()[keep] * n
    if pooled:
        wrong = torch.cat([wrong, (n - wrong.sum()).reshape(1)])
    assert chi_square_p_value(observed, wrong) < 1e-6


def test_the_chi_square_p_value_is_the_textbook_one() -> None:
    """Table values: 3.841 is chi-square's 95th percentile at 1 degree of freedom, 11.070 at 5."""
    for stat, cells in ((3.841, 2), (11.070, 6)):
        d = math.sqrt(stat * 100.0 / 2)  # two cells off by +-d from 100 give the statistic 2 d^2 / 100
        observed = torch.tensor([100.0 + d, 100.0 - d] + [100.0] * (cells - 2))
        assert abs(chi_square_p_value(observed, torch.full((cells,), 100.0)) - 0.05) < 1e-4
