"""Muon for the blocks' weight matrices, AdamW for every other parameter, in one optimizer.

Muon (MomentUm Orthogonalized by Newton-Schulz; Jordan et al., 2024) keeps SGD's momentum M and replaces the
update M = U S Vᵀ by its orthogonal factor U Vᵀ: every direction the gradient moves the matrix in gets the
same step size, however small its singular value, so rare but useful directions are not drowned by the few
large ones that dominate a raw gradient. One step of a matrix W (out x in):

    M   <- μ M + (1 - μ) G                      (momentum, as a running average)
    N   =  G + μ (M - G)                        (Nesterov: look ahead along the momentum)
    O   ≈  U Vᵀ of N                            (`orthogonalize`, five Newton-Schulz iterations)
    O   <- O ⊘ sqrt(V) · ||O|| / ||O ⊘ sqrt(V)||    (with optim.muon_beta2: `normalize_neurons`)
    W   <- (1 - lr · λ) W - lr · f · O,   f = sqrt(max(1, out / in))
           (cautious weight decay: W <- W - lr · f · (λ W ⊙ [O W ≥ 0] + O), λ only on the entries where O and
           W have the same sign, those the update already moves towards zero, and at the update's lr f · lr)

With optim.muon_orthogonalize=polar_express, O is `polar_express`'s instead; with optim.muon_split_qkv the
attention's fused q/k/v matrix is three matrices here (its row blocks, each with its own O, V and f).

The factor f gives tall matrices (more outputs than inputs, e.g. the FFN's up
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

Under DDP or FSDP2 each matrix's f · O (split, orthogonalised, normalised, as in one process) is computed by
one rank only, from the whole momentum, and sent to the others (minigpt/cluster/whole_matrices.py) with the
second moments V it updated, so that every rank holds the same V; the momentum and the decayed step are
elementwise and stay here, applied by every rank to the rows it holds.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch.distributed.tensor import DTensor
from torch.optim.adamw import adamw

from minigpt.cluster.distributed import local_tensor
from minigpt.cluster.whole_matrices import my_rows, on_owners

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # Jordan et al.: the largest slope at 0 that still converges
NS_EPS = 1e-7  # keeps a zero gradient (a parameter that got none) from dividing by zero
# Polar Express (Amsel et al., 2025): one (a, b, c) per step, each the best odd quintic for the singular
# values the steps before it leave, for five steps
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


def _frobenius(x: torch.Tensor) -> torch.Tensor:
    """(..., m, n) -> (..., 1, 1): the Frobenius norm of each matrix of a stack."""
    return x.norm(dim=(-2, -1), keepdim=True)


def orthogonalize(g: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(..., m, n) -> (..., m, n): approximately U Vᵀ of g = U S Vᵀ (of each matrix of a stack), by `steps`
    Newton-Schulz iterations with their matmuls in `dtype`.

    The iteration runs on the wide orientation (rows <= columns), where X Xᵀ is the smaller square matrix.
    Recipes for GPUs run it in bfloat16: it only has to land the singular values near 1, which bfloat16's
    8 bits do; float32 is exact on every CPU, including those that emulate bfloat16.
    """
    x = g.float()
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT  # (..., n, m), n < m
    x = (x / (_frobenius(x) + NS_EPS)).to(dtype)  # Frobenius >= spectral norm: singular values in [0, 1]
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.mT  # (..., r, r), r = min(m, n)
        x = a * x + (b * gram + c * gram @ gram) @ x  # (..., r, max(m, n))
    return (x.mT if tall else x).to(g.dtype)


def polar_express(g: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(..., m, n) -> (..., m, n): U Vᵀ of g = U S Vᵀ (of each matrix of a stack), nearer than `orthogonalize`
    gets, its matmuls in `dtype` (the norms in float32). Three changes:
    the rows are first scaled to a common norm (the mean row's, keeping ||g||): a few long rows would
    otherwise own the top singular values; each of the (at most five) steps has its own quintic
    (`POLAR_EXPRESS`), which lands the singular values near 1 rather than around it; and the result is
    scaled to the Frobenius norm of an exact U Vᵀ, sqrt(min(m, n))."""
    x = g.float()
    rows = x.norm(dim=-1, keepdim=True).clamp_min(1e-6)  # (..., m, 1)
    x = x * (_frobenius(x) / math.sqrt(x.shape[-2]) / rows)
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT  # (..., n, m), n < m
    x = (x / (_frobenius(x) * 1.01 + 1e-6)).to(dtype)  # every singular value below 1, with a margin
    for a, b, c in POLAR_EXPRESS[:steps]:
        gram = x @ x.mT  # (..., r, r), r = min(m, n)
        x = a * x + (b * gram + c * gram @ gram) @ x
    x = x.float()
    x = x * (math.sqrt(min(x.shape[-2:])) / _frobenius(x).clamp_min(1e-6))
    return (x.mT if tall else x).to(g.dtype)


def normalize_neurons(update: torch.Tensor, second_moment: torch.Tensor, beta2: float) -> torch.Tensor:
    """(..., m, n) orthogonalised update(s) -> (..., m, n): each neuron's share evened out, each matrix
    keeping its norm.

    The orthogonal factor gives every direction the same size, but not every neuron (a row of a tall or
    square matrix, a column of a wide one): some rows of U Vᵀ are much longer than others. V, a running
    mean (decay beta2) of each neuron's mean square, (..., m, 1) or (..., 1, n) and updated in place, divides
    them out, and the result is scaled back to the norm it had, so only the shares change (NorMuon).
    """
    dim = -1 if update.shape[-2] >= update.shape[-1] else -2  # average over the shorter side
    second_moment.lerp_(update.float().square().mean(dim=dim, keepdim=True), 1 - beta2)
    scaled = update / second_moment.sqrt().clamp_min(NS_EPS)
    return (scaled * (_frobenius(update) / _frobenius(scaled).clamp_min(NS_EPS))).to(update.dtype)


def _factor(rows: int, cols: int) -> float:
    """f = sqrt(max(1, out / in)): tall blocks get larger entries, the per-entry step of a square one."""
    return math.sqrt(max(1.0, rows / cols))


def newton_schulz_flops(shape: tuple[int, int]) -> int:
    """FLOPs of one Newton-Schulz iteration on an (m, n) matrix: with r = min(m, n), k = max(m, n),
    X Xᵀ (2 r² k), its square (2 r³) and the product with X (2 r² k), as `orthogonalize` computes them."""
    r, k = min(shape), max(shape)
    return 4 * r * r * k + 2 * r**3


class MuonAdamW(torch.optim.Optimizer):
    """Muon on the groups marked `muon=True`, AdamW on the others.

    Muon groups take lr, weight_decay, cautious, momentum, ns_steps, beta2 (None: no `normalize_neurons`),
    orthogonalize (`orthogonalize` or `polar_express`, by name) and splits (None, or the row counts of the
    blocks each matrix is orthogonalised in, e.g. a fused q/k/v matrix's three); AdamW groups take lr,
    weight_decay, betas, eps (the meaning torch.optim.AdamW gives them). The state is torch's:
    `momentum_buffer` (and `second_moment`) for a Muon matrix, `step`, `exp_avg`, `exp_avg_sq` for an AdamW
    parameter, so checkpoints save and restore it like any optimizer's.

    `over_ranks` (DDP or FSDP2) shares the orthogonalisations out, each matrix to one rank (`on_owners`);
    False in one process, where every matrix is orthogonalised here. Both compute the same step.
    `ns_dtype`: the dtype of the orthogonalisations' matmuls (`orthogonalize`).
    """

    def __init__(self, groups: list[dict], over_ranks: bool = False,
                 ns_dtype: torch.dtype = torch.float32) -> None:
        defaults = dict(muon=False, lr=1e-3, weight_decay=0.0, cautious=False, momentum=0.95, ns_steps=5,
                        beta2=None, orthogonalize="newton_schulz", splits=None, betas=(0.9, 0.95), eps=1e-8)
        super().__init__(groups, defaults)
        self.over_ranks, self.ns_dtype = over_ranks, ns_dtype
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
        mu = group["momentum"]
        nesterovs = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            m, grad = local_tensor(state["momentum_buffer"]), local_tensor(p.grad)
            m.lerp_(grad, 1 - mu)  # M <- μ M + (1 - μ) G
            nesterovs.append(grad.lerp(m, mu))  # G + μ (M - G)
        if self.over_ranks:
            moments = [self._second_moments(p, group) for p in params]  # every rank's, to receive the owner's
            steps = group["ns_steps"]
            costs = [steps * sum(newton_schulz_flops((r, p.shape[1])) for r in self._rows(p, group))
                     for p in params]
            fn = partial(self._matrix_update, params, group)  # (i, X) -> matrix i's update, with X whole
            updates = on_owners(fn, params, nesterovs, costs, states=moments)
        else:
            updates = self._stacked_updates(params, group, nesterovs)
        for p, update in zip(params, updates, strict=True):
            self._apply(p, update, group)

    def _apply(self, p: torch.Tensor, update: torch.Tensor, group: dict) -> None:
        """W <- W - lr (decay + update) on this rank's rows of `p`; `update` (its rows, n) holds f already."""
        w, lr, decay = local_tensor(p), group["lr"], group["weight_decay"]
        if group["cautious"]:  # decay only where the update already moves the entry towards 0, at its lr
            f = torch.cat([torch.full((r, 1), _factor(r, p.shape[1]), dtype=w.dtype, device=w.device)
                           for r in self._rows(p, group)])  # (m, 1)
            w.sub_(w * my_rows(f, p) * (update * w >= 0), alpha=lr * decay)
        else:
            w.mul_(1 - lr * decay)
        w.add_(update, alpha=-lr)

    @staticmethod
    def _rows(p: torch.Tensor, group: dict) -> list[int]:
        """The rows of each block `p` is orthogonalised in: its `splits`, or all of them at once."""
        return group["splits"] or [p.shape[0]]

    def _matrix_update(self, params: list[torch.Tensor], group: dict, i: int, nesterov: torch.Tensor
                       ) -> torch.Tensor:
        """(m, n) whole Nesterov momentum of params[i] -> (m, n) update: each row block's, times its f."""
        p, blocks = params[i], nesterov.split(self._rows(params[i], group))
        moments = self._second_moments(p, group) or [None] * len(blocks)
        return torch.cat([self._block_update(block, moment, group) * _factor(*block.shape)
                          for block, moment in zip(blocks, moments, strict=True)])

    def _stacked_updates(self, params: list[torch.Tensor], group: dict, nesterovs: list[torch.Tensor]
                         ) -> list[torch.Tensor]:
        """Every matrix's update in one process, as `_matrix_update` computes each, but with the row blocks of
        one shape orthogonalised as one stack (k, r, n): a small model's tens of blocks would otherwise each
        pay the overhead of ~15 small matmuls. Each block gets the update it would get alone (the tests
        compare the two to the last bits a batched matmul may round differently)."""
        blocks, moments, owner = [], [], []  # every row block, its second moment (or None), its matrix
        for i, (p, nesterov) in enumerate(zip(params, nesterovs, strict=True)):
            rows = self._rows(p, group)
            blocks += nesterov.split(rows)
            moments += self._second_moments(p, group) or [None] * len(rows)
            owner += [i] * len(rows)
        by_shape: dict[tuple[int, int], list[int]] = {}
        for j, block in enumerate(blocks):
            by_shape.setdefault(tuple(block.shape), []).append(j)
        updates: list[torch.Tensor] = list(blocks)  # each replaced by its update below
        for shape, js in by_shape.items():
            moment = None if moments[js[0]] is None else torch.stack([moments[j] for j in js])  # (k, r, 1)
            stack = self._block_update(torch.stack([blocks[j] for j in js]), moment, group) * _factor(*shape)
            for slot, j in enumerate(js):
                updates[j] = stack[slot]  # (r, n)
                if moment is not None:
                    moments[j].copy_(moment[slot])  # the state keeps its own tensors
        return [torch.cat([u for u, o in zip(updates, owner, strict=True) if o == i])
                for i in range(len(params))]

    def _second_moments(self, p: torch.Tensor, group: dict) -> list[torch.Tensor]:
        """`p`'s second moments V where beta2 is set, one per row block (`second_moment`, or `second_moment.j`
        when split), zeros at first: (r, 1), or (1, n) for a wide block."""
        if group["beta2"] is None:
            return []
        rows, n = self._rows(p, group), p.shape[1]
        keys = [f"second_moment.{j}" for j in range(len(rows))] if group["splits"] else ["second_moment"]
        for key, r in zip(keys, rows, strict=True):
            if key not in self.state[p]:
                self.state[p][key] = torch.zeros((r, 1) if r >= n else (1, n), device=p.device)
        return [self.state[p][key] for key in keys]

    def _block_update(self, block: torch.Tensor, moment: torch.Tensor | None, group: dict) -> torch.Tensor:
        """(..., r, n) rows of the Nesterov momentum (a block, or a stack of them) -> (..., r, n):
        orthogonalised, with `normalize_neurons` by the block's second moment where there is one."""
        orth = polar_express if group["orthogonalize"] == "polar_express" else orthogonalize
        update = orth(block, group["ns_steps"], self.ns_dtype)
        return update if moment is None else normalize_neurons(update, moment, group["beta2"])

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
