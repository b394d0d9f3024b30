"""Cross-entropy fused with the output projection, computed a chunk of rows at a time.

The plain loss (gpt.py) materialises the logits of every position: (B·T, V) floats, 400 MB for a
batch of 8 x 256 tokens over GPT-2's 50k vocabulary. Softmax, the loss and its gradient then each
stream that tensor through memory again, and on a CPU those passes cost about as much as a third of
the output projection's matmuls. Here the rows are processed a chunk at a time: for each chunk,
logits = x W^T, then in place

    loss_i  = logsumexp(logits_i) - logits_i[target_i]
    dlogits = softmax(logits_i) - onehot(target_i)         (N times the gradient of the mean loss)

and the chunk's gradients dx = dlogits W / N and dW += dlogits^T x are computed right away, in the
forward pass, in the chunk's own memory (softmax and gradient overwrite the logits). Backward only
scales them by the incoming gradient. The arithmetic is F.cross_entropy's (the tests compare the
two), the (B·T, V) tensor never exists, and no logits are returned: use it where the caller wants
the loss alone (training). Targets of -1 are ignored, as in the plain loss.

With a soft cap c (`model.logit_softcap`) the logits are z = c·tanh(u / c) of the raw products u. The chunk
computes them through the sigmoid, tanh(a) = 2σ(2a) - 1, because a sigmoid costs a few times less than a tanh
on a CPU and the whole (n, V) pass dominates a small model's step:

    s = σ(2u / c)          (the head's weights are scaled by 2 / c before the matmul)
    z = 2c·s - c           softmax(z) = softmax(2c·s): the constant -c cancels, so it is never subtracted
    dz/du = 4·s·(1 - s)    the chain rule's factor for dlogits; its 4 is applied with the 1/N below

The loss reads log-probabilities from one `log_softmax` per chunk, whose exponential is the softmax.

Mixed precision. Under autocast (bf16 or fp16) the two matmuls per chunk run in the autocast dtype, as
the plain path's lm_head would, and everything between them in float32: the logits are widened once per
chunk, so logsumexp, the loss sum and the softmax never lose the digits a 16-bit sum would (bf16 keeps 8
significant bits). dlogits is narrowed *before* the 1/N of the mean is applied: softmax - onehot lies in
[-1, 1], where float16 is accurate, while (softmax - onehot) / N with N = 16k tokens would fall below
float16's smallest normal number (6e-5) and flush to zero; the reference path avoids the same underflow
only because GradScaler multiplies the gradient first. 1/N is applied to dx and dW in float32. dW is
accumulated over the chunks in float32, like the weight's own gradient.
"""

from __future__ import annotations

import torch

# Rows per chunk: of 64-512, 512 measured fastest for a 50k vocabulary (big matmuls, few passes over dW);
# its logits are 512 x V floats, 100 MB at V = 50k, against 400 MB for a whole 8 x 256 batch.
DEFAULT_CHUNK_ROWS = 512


class LinearCrossEntropy(torch.autograd.Function):
    """mean cross-entropy of (x W^T) against targets; x (N, C), W (V, C), targets (N,) -> scalar (float32).

    The matmuls run in `dtype` (the autocast dtype, or the operands' own); see the module docstring."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_rows: int,
                compute_grad: bool, dtype: torch.dtype, softcap: float = 0.0) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):  # the casts below are explicit
            return _forward(ctx, x, weight, targets, chunk_rows, compute_grad, dtype, softcap)

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_x, grad_w = ctx.saved_tensors
        if grad_x is None:
            raise RuntimeError("linear_cross_entropy was called without compute_grad; it has no gradient")
        grad_x = (grad_x * grad_loss).to(ctx.x_dtype)
        grad_w = (grad_w * grad_loss).to(ctx.w_dtype)
        return grad_x, grad_w, None, None, None, None, None


def _forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_rows: int,
             compute_grad: bool, dtype: torch.dtype, softcap: float) -> torch.Tensor:
    ctx.x_dtype, ctx.w_dtype = x.dtype, weight.dtype
    valid = targets != -1  # (N,)
    inv_count = 1.0 / valid.sum()  # a tensor: no host sync; 1/0 = inf gives NaN like F.cross_entropy
    w = weight.to(dtype)  # (V, C): one cast per call, where autocast would cast once per matmul
    w_in = (weight * (2.0 / softcap)).to(dtype) if softcap else w  # (V, C): the products are 2u / c
    x = x.to(dtype)  # (N, C)
    grad_scale = inv_count * 4.0 if softcap else inv_count  # 1/N, times the 4 of dz/du = 4·s·(1 - s)
    loss = torch.zeros((), dtype=torch.float32, device=x.device)
    grad_x = torch.empty(x.shape, dtype=torch.float32, device=x.device) if compute_grad else None
    grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=x.device) if compute_grad else None
    for start in range(0, x.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        xs, keep = x[rows], valid[rows]  # (n, C), (n,)
        tgt = targets[rows].clamp(min=0).unsqueeze(1)  # (n, 1); ignored rows point at 0, then masked
        logits = (xs @ w_in.t()).float()  # (n, V) float32 (a no-op in float32; widened once otherwise)
        if softcap:
            s = logits.sigmoid_()  # (n, V): σ(2u / c), in place
            slope = torch.addcmul(s, s, s, value=-1.0) if compute_grad else None  # (n, V): s - s², dz/du / 4
            logits = s.mul_(2.0 * softcap)  # (n, V): z + c, the capped logits up to a constant per row
        log_probs = torch.log_softmax(logits, dim=-1)  # (n, V)
        loss -= (log_probs.gather(1, tgt).squeeze(1) * keep).sum()
        if not compute_grad:
            continue
        probs = log_probs.exp_()  # (n, V) softmax, reusing the log-probabilities' memory
        probs.scatter_add_(1, tgt, torch.full_like(tgt, -1, dtype=probs.dtype))  # minus one-hot, in [-1, 1]
        if softcap:
            probs.mul_(slope)  # (n, V): through the cap (but its 4), in [-1/4, 1/4]
        dlogits = probs.to(dtype)  # (n, V); the same tensor in float32
        row_scale = (keep * grad_scale).unsqueeze(1)  # (n, 1): 1/N (and the cap's 4), 0 for ignored rows
        torch.mul(torch.mm(dlogits, w), row_scale, out=grad_x[rows])  # (n, C)
        xs_kept = xs * keep.unsqueeze(1).to(dtype)  # (n, C): ignored rows add nothing to dW
        if dtype == torch.float32:
            grad_w.addmm_(dlogits.t(), xs_kept)  # (V, C), in place
        else:
            grad_w += torch.mm(dlogits.t(), xs_kept)  # (V, C) in `dtype`, summed in float32
    if compute_grad:
        grad_w.mul_(grad_scale)
    ctx.save_for_backward(grad_x, grad_w)
    return loss * inv_count


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_rows: int = DEFAULT_CHUNK_ROWS, softcap: float = 0.0) -> torch.Tensor:
    """x (..., C), weight (V, C), targets (...) -> mean cross-entropy of x W^T (float32), without the logits;
    softcap c > 0 caps the logits at c·tanh(x W^T / c) first.

    Under autocast the matmuls run in the autocast dtype, as `nn.Linear` would; otherwise in x's dtype."""
    x2 = x.reshape(-1, x.shape[-1])  # (N, C)
    device_type = x.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
    compute_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return LinearCrossEntropy.apply(x2, weight, targets.reshape(-1), chunk_rows, compute_grad, dtype, softcap)
