"""When fast/ runs its Triton kernels (fast.kernels.causal_scan, fast.kernels.favor_features)
instead of the PyTorch code they twin: the choice made in one place, without importing Triton
until a kernel is wanted.

The switch is ``CAUSAL_KERNEL`` (read at every call; its default comes from the environment
variable MASKBENCH_CAUSAL_KERNEL, else "auto"):

- "auto": the causal scan for CUDA tensors of float32, bfloat16 or float16 with m, d <= MAX_WIDTH,
  and the FAVOR+ features for float32 CUDA inputs of width d <= MAX_WIDTH, when Triton imports;
  the PyTorch code otherwise (float64 too: the kernel's float64 dots are not the
  tensor-core path, and the PyTorch scan is the one verified at that precision);
- "off": always the PyTorch scan;
- "force": the kernel wherever Triton can run it, any floating dtype: CUDA tensors, and CPU tensors
  when TRITON_INTERPRET=1 was set before Triton was imported (the interpreter; how the tests check
  it without a GPU, tests/fast/test_causal_triton.py).
"""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
from typing import Callable

import torch

__all__ = ["CAUSAL_KERNEL", "MAX_WIDTH", "MODES", "dot_precision", "interpreting", "require_triton",
           "triton_supported", "use_causal_kernel", "use_feature_kernel"]

#: The values of CAUSAL_KERNEL.
MODES = ("auto", "off", "force")
#: "auto", "off" or "force" (module doc); users set ``fast.kernels.dispatch.CAUSAL_KERNEL = "off"``.
CAUSAL_KERNEL = os.environ.get("MASKBENCH_CAUSAL_KERNEL", "auto")
#: The widest m and d the kernel takes (one block of features per program; wider runs the PyTorch scan).
MAX_WIDTH = 256
#: The dtypes "auto" sends to the kernel.
AUTO_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpreting() -> bool:
    """Whether TRITON_INTERPRET asks Triton to run kernels on CPU tensors by its interpreter (it
    must be set before Triton is imported; Triton reads it then). O(1).

    >>> import os
    >>> from fast.kernels.dispatch import interpreting
    >>> interpreting() == (os.environ.get("TRITON_INTERPRET", "0").lower() not in ("", "0", "false", "no"))
    True
    """
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "no")


def use_causal_kernel(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether CausalMask.attend runs the Triton scan for features phi_q, phi_k (..., N, m) and
    values v (..., N, d) under the switch CAUSAL_KERNEL (module doc); "auto" also asks for one
    dtype and one device for the three. O(1); imports nothing for CPU tensors under "auto".
    ValueError naming CAUSAL_KERNEL for a value outside MODES.

    >>> import torch
    >>> from fast.kernels.dispatch import use_causal_kernel
    >>> x = torch.ones(8, 4)
    >>> use_causal_kernel(x, x, x)   # CPU tensors: the PyTorch scan
    False
    """
    return _switch(phi_q, lambda: (phi_q.is_cuda and phi_q.dtype in AUTO_DTYPES and phi_q.dtype == phi_k.dtype == v.dtype
                                   and phi_q.device == phi_k.device == v.device
                                   and phi_q.shape[-1] <= MAX_WIDTH and v.shape[-1] <= MAX_WIDTH))


def use_feature_kernel(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether fast.attention forms the driver's FAVOR+ features for inputs x (..., N, d) and a
    projection w (m, d) in their compute dtype by the Triton kernels (fast.kernels.favor_features)
    under the switch CAUSAL_KERNEL (module doc): "auto" asks for float32 CUDA tensors of one device;
    every mode for d <= MAX_WIDTH. O(1); imports nothing for CPU tensors under "auto". ValueError
    naming CAUSAL_KERNEL for a value outside MODES.

    >>> import torch
    >>> from fast.kernels.dispatch import use_feature_kernel
    >>> use_feature_kernel(torch.ones(8, 4), torch.ones(16, 4))   # CPU tensors: favor_exponentials
    False
    """
    return x.shape[-1] <= MAX_WIDTH and _switch(
        x, lambda: x.is_cuda and x.dtype == torch.float32 == w.dtype and x.device == w.device)


def _switch(x: torch.Tensor, auto: Callable[[], bool]) -> bool:
    """CAUSAL_KERNEL's answer for a kernel on tensors like x whose "auto" conditions are auto():
    never under "off"; under "auto" where they hold; under "force" wherever Triton can run it."""
    mode = CAUSAL_KERNEL
    if mode not in MODES:
        raise ValueError(f"fast.kernels.dispatch.CAUSAL_KERNEL (or MASKBENCH_CAUSAL_KERNEL) must be one of {MODES}, "
                         f"got {mode!r}")
    if mode == "off" or (mode == "auto" and not auto()) or not (x.is_cuda or interpreting()):
        return False
    return triton_supported()


def dot_precision(x: torch.Tensor) -> str:
    """tl.dot's input_precision for kernel inputs like x: float32 products to float32 accuracy
    unless torch itself allows TF32 for them, by three TF32 products (split operands, on tensor
    cores, where IEEE products would run on the FMA units) on a GPU with TF32 (compute capability
    8.0 on), IEEE otherwise and on a CPU (Triton's interpreter); TF32 for half-precision inputs (it
    holds their values exactly); IEEE for float64. O(1).

    >>> import torch
    >>> from fast.kernels.dispatch import dot_precision
    >>> dot_precision(torch.ones(2, dtype=torch.float64)), dot_precision(torch.ones(2, dtype=torch.bfloat16))
    ('ieee', 'tf32')
    """
    if x.dtype == torch.float64:
        return "ieee"
    if x.dtype in (torch.bfloat16, torch.float16):
        return "tf32"
    if not x.is_cuda:
        return "ieee"
    if torch.backends.cuda.matmul.allow_tf32:
        return "tf32"
    return "tf32x3" if torch.cuda.get_device_capability(x.device) >= (8, 0) else "ieee"


def require_triton(x: torch.Tensor, what: str, imported: bool = True) -> None:
    """RuntimeError saying why ``what`` (a kernel's name) cannot run on tensors like x: Triton 3 or
    later is not installed (or, ``imported`` False, failed to import), or x is a CPU tensor and
    Triton's interpreter is off. O(1).

    >>> import torch
    >>> from fast.kernels.dispatch import interpreting, require_triton
    >>> try:
    ...     require_triton(torch.ones(2), "a kernel")
    ...     ok = interpreting()
    ... except RuntimeError as err:
    ...     ok = "a kernel" in str(err)
    >>> ok
    True
    """
    if not imported or not triton_supported():
        raise RuntimeError(f"{what} needs triton >= 3 (pip install triton; CUDA builds of torch bring it): "
                           "fast/ runs its PyTorch code without it")
    if not x.is_cuda and not interpreting():
        raise RuntimeError(f"{what} runs on CUDA tensors, or on CPU tensors under Triton's interpreter "
                           f"(TRITON_INTERPRET=1 set before triton is imported); got tensors on {x.device}")


@functools.lru_cache(maxsize=1)
def triton_supported() -> bool:
    """Whether a Triton the kernels run on is installed: version 3 or later (tl.dot's
    input_precision), read from the package metadata without importing it. An older Triton (pinned by
    an older CUDA build of torch) leaves the PyTorch scans in use rather than being replaced. O(1)
    after the first call.

    >>> from fast.kernels.dispatch import triton_supported
    >>> triton_supported() in (True, False)
    True
    """
    if importlib.util.find_spec("triton") is None:
        return False
    for dist in ("triton", "pytorch-triton"):  # CUDA nightlies of torch ship the latter
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        major = version.split(".")[0]
        return major.isdigit() and int(major) >= 3
    return True  # importable but unregistered (a source build): let the kernel try
