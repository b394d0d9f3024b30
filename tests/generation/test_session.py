"""Interactive sessions: the cache is reused across turns, and every reply equals a fresh run from the
whole history (cached and naive), also after the window fills and the cache is rebuilt."""

from __future__ import annotations

import torch
from model_helpers import tiny_config

from minigpt.generation.session import Session
from minigpt.model.factory import build_model
from minigpt.sampling.decode import generate
from minigpt.sampling.params import SamplingParams

BLOCK = 16
PARAMS = SamplingParams(1.0, top_k=16)


def tiny(seed: int = 0, **overrides) -> torch.nn.Module:
    cfg = dict(n_layer=2, n_head=4, n_embd=32, block_size=BLOCK, vocab_size=64, pos_encoding="rope")
    cfg.update(overrides)
    model = build_model(tiny_config(**cfg))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # sharp random weights, so the context matters (see sampling/test_decode.py)
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


def fresh_reply(model, history, state, n, use_cache, stop_ids=()):
    """A new generation from the whole history as one prompt, with the session's generator state."""
    g = torch.Generator()
    g.set_state(state)
    res = generate(model, [history], max_new_tokens=n, params=PARAMS, generator=g, use_cache=use_cache,
                   stop_ids=stop_ids)  # fmt: skip
    return res.tokens[0]


def play(model, turns, n, stop_ids=()):
    """Run the turns; check each reply against fresh runs; return the session and the rebuild widths."""
    rebuilt: list[int] = []
    g = torch.Generator().manual_seed(0)
    session = Session(model, PARAMS, g, stop_ids=stop_ids, on_rebuild=rebuilt.append)
    for prompt in turns:
        state = g.get_state()
        context = session.history + prompt
        reply = list(session.turn(prompt, n))
        for use_cache in (True, False):
            assert reply == fresh_reply(model, context, state, n, use_cache, stop_ids)
    return session, rebuilt


def test_two_turns_reuse_the_cache_and_match_fresh_runs():
    model = tiny()
    session, rebuilt = play(model, [[1, 2, 3, 4], [5, 6, 7]], n=3)
    # turn 1: 4 prompt tokens, then 2 decode feeds (the 3rd reply token stays pending);
    # turn 2 prefills only the pending token and its own 3 tokens, not the 9 before them.
    assert session.last_prefill == 1 + 3
    assert session.prefilled_tokens == 4 + 2 + 4 + 2
    assert len(session.history) == 4 + 3 + 3 + 3 and rebuilt == []
    assert session.width == len(session.history) - 1  # everything but the pending token is cached


def test_window_fills_rebuilds_and_still_matches():
    model = tiny(seed=1)
    session, rebuilt = play(model, [[1, 2, 3], [4, 5, 6, 7, 8], list(range(10, 22)), [9]], n=6)
    assert len(session.history) > 2 * BLOCK
    assert rebuilt and session.rebuilds == len(rebuilt)
    assert all(w <= BLOCK for w in rebuilt)


def test_stop_token_ends_a_turn_and_stays_in_the_history():
    model = tiny(seed=2)
    g = torch.Generator().manual_seed(0)
    probe = Session(model, PARAMS, g)
    first = list(probe.turn([1, 2, 3], 8))
    stop = first[3]
    session, _ = play(model, [[1, 2, 3], [4, 4]], n=8, stop_ids=[stop])
    assert stop in session.history[3:]
