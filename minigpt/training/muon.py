"""Muon for the blocks' weight matrices, AdamW for every other parameter, in one optimizer.

Muon (MomentUm Orthogonalized by Newton-Schulz; Jordan et al., 2024) keeps SGD's momentum M and replaces the
update M = U S Vᵀ by its orthogonal factor U Vᵀ: every direction the gradient moves the matrix in gets the
same step size, however small its singular value, so rare but useful directions are not drowned by the few
large ones that dominate a raw gradient. One step of a matrix W (out x in):

    M   <- μ M + (1 - μ) G                      (momentum, as a running average)
    N   =  G + μ (M - G)                        (Nesterov: look ahead along the momentum)
    O   ≈  U Vᵀ of N                            (`orthogonalize`, five Newton-Schulz iterations)
    W   <- (1 - lr · λ) W - lr · sqrt(max(1, out / in)) · O

The factor sqrt(max(1, out/in)) gives tall matrices (more outputs than inputs, e.g. the FFN's up
projection) the same per-entry step size as square ones. U Vᵀ would need an SVD; the iteration

    X <- a X + (b A + c A²) X,   A = X Xᵀ,   (a, b, c) = (3.4445, -4.7750, 2.0315)

applied to X = N / ||N||_F (so every singular value starts in (0, 1]) maps each singular value s through the
odd polynomial a s + b s³ + c s⁵, which pushes every value in (0, 1] towards 1 within five steps. The
coefficients make the slope at 0 large (a = 3.4) so that tiny singular values grow fast; the price is that
the values end up spread around 1 (roughly 0.7 to 1.2) rather than at 1 exactly, which does not hurt
training. U and V are unchanged, since each step is a polynomial in X Xᵀ times X.

Muon is for the hidden layers' matrices only. The embeddings (a row moves only when its token occurs, so
orthogonalising across rows means nothing), the output head (its rows are per-token scores, like an
embedding's), the norms' gains, biases and the little gates are trained by AdamW (torch's own functional
implementation, fused), as in every Muon recipe. `build_optimizer` (optim.py) makes the split.

Under DDP or FSDP2 each matrix is orthogonalised by one rank only, from the whole momentum, and the result
sent to the others (minigpt/cluster/whole_matrices.py); the momentum and the update are elementwise and stay
here, applied by every rank to the rows it holds.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch.distributed.tensor import DTensor
from torch.optim.adamw import adamw

from minigpt.cluster.distributed import local_tensor
from minigpt.cluster.whole_matrices import on_owners

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan et al.: the largest slope at 0 that still converges
NS_EPS = 1e-7  # keeps a zero gradient (a parameter that got none) from dividing by zero


def orthogonalize(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """(m, n) -> (m, n): approximately U Vᵀ of g = U S Vᵀ, by `steps` Newton-Schulz iterations in float32.

    The iteration runs on the wide orientation (rows <= columns), where X Xᵀ is the smaller square matrix.
    Recipes for GPUs run it in bfloat16; float32 costs little at these sizes and is exact on every CPU,
    including those that emulate bfloat16.
    """
    x = g.float()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.t()  # (n, m), n < m
    x = x / (x.norm() + NS_EPS)  # Frobenius norm >= spectral norm: every singular value in [0, 1]
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.t()  # (r, r), r = min(m, n)
        x = a * x + (b * gram + c * gram @ gram) @ x  # (r, max(m, n))
    return (x.t() if tall else x).to(g.dtype)


def newton_schulz_flops(shape: tuple[int, int]) -> int:
    """FLOPs of one Newton-Schulz iteration on an (m, n) matrix: with r = min(m, n), k = max(m, n),
    X Xᵀ (2 r² k), its square (2 r³) and the product with X (2 r² k), as `orthogonalize` computes them."""
    r, k = min(shape), max(shape)
    return 4 * r * r * k + 2 * r**3


class MuonAdamW(torch.optim.Optimizer):
    """Muon on the groups marked `muon=True`, AdamW on the others.

    Muon groups take lr, weight_decay, momentum, ns_steps; AdamW groups take lr, weight_decay,
    betas, eps (the meaning torch.optim.AdamW gives them). The state is torch's: `momentum_buffer` for a
    Muon matrix, `step`, `exp_avg`, `exp_avg_sq` for an AdamW parameter, so checkpoints save and restore it
    like any optimizer's.

    `over_ranks` (DDP or FSDP2) shares the orthogonalisations out, each matrix to one rank (`on_owners`);
    False in one process, where every matrix is orthogonalised here.
    """

    def __init__(self, groups: list[dict], over_ranks: bool = False) -> None:
        defaults = dict(muon=False, lr=1e-3, weight_decay=0.0, momentum=0.95, ns_steps=5, betas=(0.9, 0.95),
                        eps=1e-8)
        super().__init__(groups, defaults)
        self.over_ranks = over_ranks
        for group in self.param_groups:
            if group["muon"] and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon groups hold matrices only")
            if group["muon"] and not over_ranks and any(isinstance(p, DTensor) for p in group["params"]):
                raise ValueError("a shard is not orthogonalised alone: FSDP2 needs over_ranks=True")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["muon"]:
                self._muon_step(group, params)
            elif params:
                self._adamw_step(group, params)
        return loss

    def _muon_step(self, group: dict, params: list[torch.Tensor]) -> None:
        """Under FSDP2 `local_tensor` is the rows this rank holds (of the weight, its gradient, its momentum,
        all sharded alike), and `p.shape` the whole matrix's."""
        lr, mu = group["lr"], group["momentum"]
        nesterovs = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            m, grad = local_tensor(state["momentum_buffer"]), local_tensor(p.grad)
            m.lerp_(grad, 1 - mu)  # M <- μ M + (1 - μ) G
            nesterovs.append(grad.lerp(m, mu))  # G + μ (M - G)
        steps = group["ns_steps"]
        if self.over_ranks:
            costs = [steps * newton_schulz_flops((p.shape[0], p.shape[1])) for p in params]
            updates = on_owners(partial(orthogonalize, steps=steps), params, nesterovs, costs)
        else:
            updates = [orthogonalize(nesterov, steps) for nesterov in nesterovs]
        for p, update in zip(params, updates, strict=True):
            w = local_tensor(p)
            w.mul_(1 - lr * group["weight_decay"])
            w.add_(update, alpha=-lr * math.sqrt(max(1.0, p.shape[0] / p.shape[1])))

    def _adamw_step(self, group: dict, params: list[torch.Tensor]) -> None:
        device = params[0].device
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=device)  # fused wants a tensor
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
        beta1, beta2 = group["betas"]
        states = [self.state[p] for p in params]
        adamw(params, [p.grad for p in params], [s["exp_avg"] for s in states],
              [s["exp_avg_sq"] for s in states], [], [s["step"] for s in states],
              fused=device.type in ("cuda", "cpu"), amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"],
              weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
