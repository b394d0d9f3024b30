"""The decode attention's choice (fast/attention.py): it follows the measurement (injected), the measurement
runs each backend as the step will (oneDNN's flag, compiled or not), and the compiled backends compute the
eager attention."""

from __future__ import annotations

import math

import pytest
import torch
from model_helpers import tiny_config

from minigpt.fast import attention


@pytest.mark.parametrize(("own", "times", "compile", "chosen"), [
    ("sdpa", {"sdpa": 3.0, "math": 1.0}, False, "math"),
    ("sdpa", {"sdpa": 1.1, "math": 1.0}, False, "sdpa"),  # within the noise margin: the model's own
    ("math", {"sdpa": 1.0, "math": 3.0}, False, "sdpa"),
    ("online", {"sdpa": 1.1, "math": 1.0}, False, "sdpa"),  # the teaching backend is compared as sdpa
    ("sdpa", {"sdpa": 3.0, "math": 2.0, "streamed": 1.0}, True, "streamed"),  # a compiled step's only
    ("sdpa", {"sdpa": 1.1, "math": 3.0, "streamed": 1.0}, True, "sdpa"),
])  # fmt: skip
def test_the_attention_choice_follows_the_measurement(own, times, compile, chosen, monkeypatch) -> None:
    monkeypatch.setattr(attention, "compile_problem", lambda device: None)
    seen = []

    def measure(config, dtype, device, rows, backends, onednn, compiled):
        seen.append((config.attention, dtype, rows, backends, onednn, compiled))
        return {b: times[b] for b in backends}

    config = tiny_config(attention=own, vocab_size=61)
    backend, why = attention.choose_attention(config, torch.bfloat16, torch.device("cpu"), 2, False, compile,
                                              measure)
    assert backend == chosen and f"{chosen} attention" in why
    assert seen == [(own, torch.bfloat16, 2, tuple(times), False, compile)]


def test_without_a_compiler_the_attention_is_timed_eagerly_as_the_step_will_run(monkeypatch) -> None:
    monkeypatch.setattr(attention, "compile_problem", lambda device: "no C++ compiler was found")
    seen = []
    measure = lambda config, dtype, device, rows, backends, onednn, compiled: seen.append(
        (backends, compiled)) or dict.fromkeys(backends, 1.0)
    attention.choose_attention(tiny_config(vocab_size=61), torch.float32, torch.device("cpu"), 1, True, True,
                               measure)
    assert seen == [(("sdpa", "math"), False)]


def test_the_attention_measurements_are_real_times() -> None:
    config = tiny_config(vocab_size=61, block_size=16)
    times = attention.time_attention(config, torch.bfloat16, torch.device("cpu"), 2, ("sdpa", "math"),
                                     repeats=1)
    assert set(times) == {"sdpa", "math"} and all(0 < t < math.inf for t in times.values())
    assert attention.cache_lengths(16) == [2, 8, 16] and attention.cache_lengths(4) == [1, 2, 4]


@pytest.mark.parametrize("onednn", [True, False])
def test_the_attention_is_timed_under_the_step_s_onednn_flag(onednn, monkeypatch) -> None:
    """A step runs with the products' flag, and 16-bit math attention is slow without oneDNN on some CPUs."""
    flags = []
    math_attention = attention.ONE_QUERY["math"]
    monkeypatch.setitem(attention.ONE_QUERY, "math", lambda *a: flags.append(torch.backends.mkldnn.enabled)
                        or math_attention(*a))
    config = tiny_config(vocab_size=61, block_size=16)
    attention.time_attention(config, torch.bfloat16, torch.device("cpu"), 1, ("math",), onednn, repeats=1)
    assert flags and set(flags) == {onednn} and torch.backends.mkldnn.enabled


@pytest.mark.slow
def test_compiled_attention_is_the_attention_and_is_timed() -> None:
    """Each backend compiled as a step compiles it gives the eager sdpa's result, for every layer."""
    config = tiny_config(vocab_size=61, block_size=16)
    gen = torch.Generator().manual_seed(0)
    qs = [torch.randn(2, config.n_head, 1, config.head_dim, generator=gen) for _ in range(2)]
    ks, vs = ([torch.randn(2, config.kv_heads, 5, config.head_dim, generator=gen) for _ in range(2)]
              for _ in range(2))
    expected = attention.attention_layers("sdpa", torch.device("cpu"), False)(qs, ks, vs)
    for backend in attention.COMPILED_BACKENDS:
        got = attention.attention_layers(backend, torch.device("cpu"), True)(qs, ks, vs)
        for a, b in zip(got, expected, strict=True):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    times = attention.time_attention(config, torch.bfloat16, torch.device("cpu"), 2,
                                     attention.COMPILED_BACKENDS, compile=True, repeats=1)
    assert set(times) == set(attention.COMPILED_BACKENDS)
    assert all(0 < t < math.inf for t in times.values())
