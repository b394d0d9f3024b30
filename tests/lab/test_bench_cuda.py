"""CUDA paths of the bench and the device check (skipped without a GPU; scripts/device_check.sh runs them)."""

from __future__ import annotations

import copy

import pytest
import torch

from minigpt.lab.bench.generation import minigpt_generate
from minigpt.lab.bench.reference import gpt2_like_config
from minigpt.lab.bench.train_step import make_step
from minigpt.model.factory import build_model

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

VOCAB, T = 211, 32


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(gpt2_like_config(n_layer=2, n_head=2, n_embd=64, vocab_size=VOCAB, block_size=T))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def _batch(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x, y = (torch.randint(0, VOCAB, (4, T), generator=gen) for _ in range(2))
    return x.to(device), y.to(device)


def test_bf16_autocast_step_matches_fp32_cpu_loss() -> None:
    cpu = _model().train()
    gpu = copy.deepcopy(cpu).cuda()
    x, y = _batch("cpu")
    loss_cpu = make_step(cpu, torch.optim.AdamW(cpu.parameters(), lr=1e-3), x, y, None, hf=False)()
    opt = torch.optim.AdamW(gpu.parameters(), lr=1e-3, fused=True)
    before = gpu.transformer.h[0].mlp.c_fc.weight.detach().clone()
    loss_gpu = make_step(gpu, opt, x.cuda(), y.cuda(), torch.bfloat16, hf=False)()
    assert gpu.transformer.h[0].mlp.c_fc.weight.dtype == torch.float32  # autocast leaves weights in fp32
    assert not torch.equal(before, gpu.transformer.h[0].mlp.c_fc.weight)
    assert abs(loss_gpu.item() - loss_cpu.item()) < 0.02 * loss_cpu.item()  # bf16 has ~3 significant digits


def test_fused_adamw_matches_cpu_adamw() -> None:
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(64, 32, generator=gen)
    grads = [torch.randn(64, 32, generator=gen) for _ in range(3)]
    results = []
    for device, fused in (("cpu", None), ("cuda", True)):
        p = torch.nn.Parameter(w.clone().to(device))
        opt = torch.optim.AdamW([p], lr=1e-2, weight_decay=0.1, fused=fused)
        for g in grads:
            p.grad = g.to(device)
            opt.step()
        results.append(p.detach().cpu())
    torch.testing.assert_close(results[1], results[0], atol=1e-6, rtol=1e-5)


def test_cuda_greedy_generation_matches_cpu() -> None:
    cpu = _model().eval()
    gpu = copy.deepcopy(cpu).cuda()
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 on both sides, so near-ties resolve alike
    assert minigpt_generate(gpu, prompt, 40) == minigpt_generate(cpu, prompt, 40)
