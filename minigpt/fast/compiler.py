"""How the wing compiles: torch.compile's options for a function of fixed modules, a copy of a function with
graphs of its own, Inductor's frozen settings, and the oneDNN flag around a call.

Eagerly, a small model's decode step is a few dozen small ops per layer, each dispatched from Python, which
costs more than their arithmetic. torch.compile's Inductor fuses the elementwise ops and norms into a few
generated kernels (C++ on a CPU, Triton on CUDA) and calls the matrix products directly. What is left of a
small step after that is Python's share, which these options remove:

- Before every call of a compiled function, Dynamo checks that nothing its graph was traced from has changed:
  for a model, hundreds of checks of its modules' attributes. A decode step's model is fixed once it is
  prepared, so those checks are skipped (`skip_guard_on_all_nn_modules_unsafe`; the tensors' shapes and
  dtypes are still checked). That is safe only where no other model can reach the same graphs, and Dynamo
  keeps graphs per code object: so each user compiles a copy of its function with a code object of its own
  (`compile_own`; tests/fast/test_step.py decodes two models that differ only in such an attribute).
- The graph's own check of every input's size and stride (a hundred per step, the weights included) guards
  against a caller handing it other tensors, which no caller of such a copy can: left out.
- On a CPU the generated kernels are called from a generated C++ function (`cpp_wrapper`), not one by one
  from Python.

Frozen (`frozen_inductor`), the weights become constants of the graph and Inductor chooses each product's
kernel itself, timing its own generated GEMM against the library's on that matrix (max-autotune); the
compiled code then holds its own copies of the weights, which is why a frozen step's model must not change.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

# Inductor's settings for a function compiled with its weights frozen into it: each product's kernel timed by
# Inductor among its own generated GEMM and the library's, quietly (its tables would mix into the text).
FROZEN_INDUCTOR = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                   "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}


class OneDNN:
    """A block with `torch.backends.mkldnn.enabled` set to `enabled`, and the flag as it was after it: with it
    on (PyTorch's default), CPU bfloat16 products of plain matrices go to oneDNN, otherwise to PyTorch's own
    kernels, and the two differ most for one row."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __enter__(self) -> None:
        self.saved = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = self.enabled

    def __exit__(self, *exc) -> None:
        torch.backends.mkldnn.enabled = self.saved


def compile_options(device: torch.device) -> dict:
    """torch.compile's options for a function of its own that runs fixed modules (the module docstring)."""
    options: dict = {"size_asserts": False}
    skip = getattr(torch.compiler, "skip_guard_on_all_nn_modules_unsafe", None)
    if skip:
        options["guard_filter_fn"] = skip
    if device.type == "cpu":
        options["cpp_wrapper"] = True
    return options


def compile_own(fn: Callable, device: torch.device, dynamic: bool) -> Callable:
    """`fn` compiled with `compile_options(device)` through a copy with a code object of its own, so no other
    caller of `fn` shares its graphs."""
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)
    return torch.compile(own, dynamic=dynamic, options=compile_options(device))


def frozen_inductor() -> AbstractContextManager:
    """Inductor's settings for compiling with the weights frozen (FROZEN_INDUCTOR), to enter around the calls
    that may compile."""
    from torch._inductor import config

    # Its autotuner calls a deprecated storage API, whose warning would land in the middle of generated text.
    warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning, r"torch\._inductor")
    return config.patch(FROZEN_INDUCTOR)
