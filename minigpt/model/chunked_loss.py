"""Cross-entropy fused with the output projection, computed a chunk of rows at a time.

The plain loss (gpt.py) materialises the logits of every position: (B·T, V) floats, 400 MB for a
batch of 8 x 256 tokens over GPT-2's 50k vocabulary. Softmax, the loss and its gradient then each
stream that tensor through memory again, and on a CPU those passes cost about as much as a third of
the output projection's matmuls. Here the rows are processed a chunk at a time: for each chunk,
logits = x W^T, then in place

    loss_i  = logsumexp(logits_i) - logits_i[target_i]
    dlogits = (softmax(logits_i) - onehot(target_i)) / N        (the gradient of the mean loss)

and the chunk's gradients dx = dlogits W and dW += dlogits^T x are computed right away, in the
forward pass, in the chunk's own memory (softmax and gradient overwrite the logits). Backward only
scales them by the incoming gradient. The arithmetic is F.cross_entropy's (the tests compare the
two), the (B·T, V) tensor never exists, and no logits are returned: use it where the caller wants
the loss alone (training). Targets of -1 are ignored, as in the plain loss.
"""

from __future__ import annotations

import torch

# Rows per chunk: of 64-512, 512 measured fastest for a 50k vocabulary (big matmuls, few passes over dW);
# its logits are 512 x V floats, 100 MB at V = 50k, against 400 MB for a whole 8 x 256 batch.
DEFAULT_CHUNK_ROWS = 512


class LinearCrossEntropy(torch.autograd.Function):
    """mean cross-entropy of (x W^T) against targets; x (N, C), W (V, C), targets (N,) -> scalar."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_rows: int,
                compute_grad: bool) -> torch.Tensor:
        valid = targets != -1  # (N,)
        inv_count = 1.0 / valid.sum()  # a tensor: no host sync; 1/0 = inf gives NaN like F.cross_entropy
        loss = torch.zeros((), dtype=torch.float32, device=x.device)
        grad_x = torch.empty_like(x) if compute_grad else None
        grad_w = torch.zeros_like(weight) if compute_grad else None
        for start in range(0, x.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            xs, keep = x[rows], valid[rows]  # (n, C), (n,)
            tgt = targets[rows].clamp(min=0).unsqueeze(1)  # (n, 1); ignored rows point at 0, then masked
            logits = xs @ weight.t()  # (n, V)
            lse = torch.logsumexp(logits, dim=-1)  # (n,)
            loss += ((lse - logits.gather(1, tgt).squeeze(1)) * keep).sum()
            if compute_grad:
                probs = logits.sub_(lse.unsqueeze(1)).exp_()  # (n, V) softmax, reusing the logits' memory
                probs.scatter_add_(1, tgt, torch.full_like(tgt, -1, dtype=probs.dtype))  # minus one-hot
                probs.mul_((keep * inv_count).unsqueeze(1))  # ignored rows contribute no gradient
                torch.mm(probs, weight, out=grad_x[rows])  # (n, C)
                grad_w.addmm_(probs.t(), xs)  # (V, C)
        ctx.save_for_backward(grad_x, grad_w)
        return loss * inv_count

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        grad_x, grad_w = ctx.saved_tensors
        if grad_x is None:
            raise RuntimeError("linear_cross_entropy was called without compute_grad; it has no gradient")
        return grad_x * grad_loss, grad_w * grad_loss, None, None, None


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_rows: int = DEFAULT_CHUNK_ROWS) -> torch.Tensor:
    """x (..., C), weight (V, C), targets (...) -> mean cross-entropy of x W^T, without the logits."""
    x2 = x.reshape(-1, x.shape[-1])  # (N, C)
    compute_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    return LinearCrossEntropy.apply(x2, weight, targets.reshape(-1), chunk_rows, compute_grad)
