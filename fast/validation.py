"""Argument checks shared by fast/: each error names the argument, what was expected and what came."""
from __future__ import annotations

import math
import numbers
import os

import numpy as np
import torch

#: The floating dtypes fast/ computes in (half precisions accumulate in float32).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_FLOATS = FLOAT_DTYPES


def check_tensor(name: str, x: object, min_dim: int = 2, check_finite: bool = True) -> torch.Tensor:
    """``x`` itself when it is a floating tensor (..., N, c) with >= min_dim dims, N >= 1, c >= 1 and
    (``check_finite``) no NaN or inf. TypeError naming ``name`` for a non-tensor or a non-floating
    dtype; ValueError for too few dims, N = 0, c = 0 or non-finite entries. O(1) on metadata, one
    pass over x with check_finite.

        >>> import torch
        >>> from fast.validation import check_tensor
        >>> tuple(check_tensor("q", torch.ones(2, 3)).shape)
        (2, 3)
        >>> check_tensor("q", torch.ones(3))
        Traceback (most recent call last):
        ...
        ValueError: q must have shape (..., N, features) with >= 2 dims, got (3,)
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOATS:
        raise TypeError(f"{name} must be a floating tensor (float16/bfloat16/float32/float64), got {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have shape (..., N, features) with >= {min_dim} dims, got {tuple(x.shape)}")
    if x.shape[-2] == 0:
        raise ValueError(f"{name} must have N >= 1 tokens, got shape {tuple(x.shape)}")
    if x.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty feature axis, got shape {tuple(x.shape)}")
    if check_finite and not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return x


def finite_flag(*tensors: torch.Tensor) -> torch.Tensor:
    """A 0-dim bool tensor, on the tensors' device: True when every entry of every tensor is finite.

    One read pass per tensor, O(numel) (torch.aminmax: no temporary of the tensor's size, unlike
    isfinite(x).all()); NaN fails both comparisons. Nothing is synchronised: the caller combines
    flags and reads them once (``bool``). Empty tensors pass.

        >>> import torch
        >>> from fast.validation import finite_flag
        >>> bool(finite_flag(torch.ones(2))), bool(finite_flag(torch.ones(2), torch.tensor([1.0, float("nan")])))
        (True, False)
    """
    flag = None  # (no constant True to start from: on a GPU each 0-dim op is a kernel launch)
    for t in tensors:
        if t.numel() == 0:  # an empty batch: nothing to check (aminmax refuses empty tensors)
            continue
        lo, hi = torch.aminmax(t.detach())
        ok = (lo > -torch.inf) & (hi < torch.inf)
        flag = ok if flag is None else flag & ok
    return torch.ones((), dtype=torch.bool, device=tensors[0].device) if flag is None else flag


def raise_if_non_finite(**tensors: torch.Tensor | None) -> None:
    """ValueError naming the first of the named tensors that holds NaN or inf (None entries are skipped).

    The drivers' rare path: they check finiteness on reductions they compute anyway, and only
    when such a check fails do they come here to say which argument was at fault. O(numel).

        >>> import torch
        >>> from fast.validation import raise_if_non_finite
        >>> raise_if_non_finite(q=torch.ones(2), k=None, v=torch.tensor([float("inf")]))
        Traceback (most recent call last):
        ...
        ValueError: v contains non-finite values (NaN or inf)
    """
    for name, t in tensors.items():
        if t is not None and not bool(torch.isfinite(t.detach()).all()):
            raise ValueError(f"{name} contains non-finite values (NaN or inf)")


def check_floating(name: str, x: object) -> torch.Tensor:
    """``x`` itself when it is a floating torch.Tensor of any shape (the input of an elementwise
    feature map); TypeError naming ``name`` otherwise. O(1).

        >>> import torch
        >>> from fast.validation import check_floating
        >>> check_floating("x", torch.ones(2, dtype=torch.int64))
        Traceback (most recent call last):
        ...
        TypeError: x must be a floating tensor (float16/bfloat16/float32/float64), got torch.int64
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOATS:
        raise TypeError(f"{name} must be a floating tensor (float16/bfloat16/float32/float64), got {x.dtype}")
    return x


#: What the drivers' ``no_key`` accepts (fast.algebra.divide documents the policies).
NO_KEY_POLICIES = ("raise", "zero")


def check_no_key(value: object) -> str:
    """The no-key policy: "raise" or "zero" (fast.algebra.divide), else ValueError naming no_key. O(1).

        >>> from fast.validation import check_no_key
        >>> check_no_key("zero")
        'zero'
    """
    if not isinstance(value, str) or value not in NO_KEY_POLICIES:
        raise ValueError(f'no_key must be "raise" or "zero" (what a query that sees no key gets: '
                         f"DenominatorError, or an output of 0), got {value!r}")
    return value


def check_tokens(name: str, x: object, n: int) -> torch.Tensor:
    """``x`` itself when it is a floating tensor (..., N, c) with N == n on axis -2 (the input of a
    mask's matmul): check_tensor's errors, or ValueError naming ``name`` for another N. O(1).

        >>> import torch
        >>> from fast.validation import check_tokens
        >>> check_tokens("x", torch.ones(4, 2), 3)
        Traceback (most recent call last):
        ...
        ValueError: x must have N=3 tokens on axis -2, got shape (4, 2)
    """
    check_tensor(name, x, check_finite=False)
    if x.shape[-2] != n:
        raise ValueError(f"{name} must have N={n} tokens on axis -2, got shape {tuple(x.shape)}")
    return x


def check_same_device(**tensors: torch.Tensor) -> None:
    """All tensors on one device, else ValueError listing them by name. O(1).

        >>> import torch
        >>> from fast.validation import check_same_device
        >>> check_same_device(q=torch.ones(1), k=torch.ones(1)) is None
        True
    """
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"tensors must be on one device, got {devices}")


def check_favor_inputs(q: torch.Tensor, k: torch.Tensor, projection: torch.Tensor) -> None:
    """Shapes, dtypes and devices of FAVOR+ inputs (metadata only, no pass over the data): q (..., N, d)
    and k (..., N', d) floating tensors, projection (m, d) on their device. TypeError / ValueError
    naming q, k or projection. O(1).

        >>> import torch
        >>> from fast.validation import check_favor_inputs
        >>> check_favor_inputs(torch.ones(2, 3, 4), torch.ones(2, 3, 4), torch.ones(8, 5))
        Traceback (most recent call last):
        ...
        ValueError: q has feature width 4 but projection expects d=5 (projection is (m, d) = (8, 5))
    """
    check_tensor("q", q, check_finite=False)
    check_tensor("k", k, check_finite=False)
    check_tensor("projection", projection, check_finite=False)
    if projection.dim() != 2:
        raise ValueError(f"projection must have shape (m, d), got {tuple(projection.shape)}")
    check_same_device(q=q, k=k, projection=projection)
    for name, x in (("q", q), ("k", k)):
        if x.shape[-1] != projection.shape[1]:
            raise ValueError(f"{name} has feature width {x.shape[-1]} but projection expects d={projection.shape[1]} "
                             f"(projection is (m, d) = {tuple(projection.shape)})")


def check_positive_int(name: str, value: object, what: str = "a positive integer", *, minimum: int = 1,
                       type_error: bool = False) -> int:
    """value as a Python int >= ``minimum`` (1: a positive integer; 0 for a count that may be empty): a
    Python or NumPy integer, bools refused. The one integer check of fast/. O(1).

    Raises ValueError f"{name} must be {what}, got {value}" for an integer below ``minimum``, and for
    a value that is not an integer either, unless ``type_error``: then TypeError f"{name} must be an
    int, got {type} {value!r}" (the callers that always documented a TypeError there). ``what``
    words the expectation as the caller's documentation does ("an int >= 1 (the number K of Gumbel
    samples averaged)"), so every message names the argument, what was expected and what came.

        >>> import numpy as np
        >>> from fast.validation import check_positive_int
        >>> check_positive_int("heads", np.int64(4))
        4
        >>> check_positive_int("heads", 0)
        Traceback (most recent call last):
        ...
        ValueError: heads must be a positive integer, got 0
        >>> check_positive_int("i_max", -1, ">= 0", minimum=0)
        Traceback (most recent call last):
        ...
        ValueError: i_max must be >= 0, got -1
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if type_error:
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        raise ValueError(f"{name} must be {what}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be {what}, got {int(value)}")
    return int(value)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype fast/ computes in for inputs of ``dtype``: half precisions accumulate in float32;
    float32 and float64 compute as they are. O(1).

        >>> import torch
        >>> from fast.validation import compute_dtype
        >>> compute_dtype(torch.bfloat16), compute_dtype(torch.float64)
        (torch.float32, torch.float64)
    """
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...], what: str = "leading dims") -> tuple[int, ...]:
    """NumPy broadcasting of two shapes (torch.broadcast_shapes lazily imports torch._refs, slow at
    its first call). ValueError naming ``what`` when they do not broadcast. O(len(shape)).

        >>> from fast.validation import broadcast_shape
        >>> broadcast_shape((2, 1), (3,))
        (2, 3)
    """
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise ValueError(f"{what} {tuple(a)} and {tuple(b)} do not broadcast")
        out.append(max(x, y) if 1 in (x, y) else x)
    return tuple(reversed(out))


def check_key_log_scale(c: object, phi_k: torch.Tensor, n: int) -> torch.Tensor:
    """key_log_scale (..., N, 1), a floating tensor whose leading dims broadcast to phi_k's, as a
    detached (*lead, N) tensor on phi_k's device and in its dtype (fast.operator, rescales_keys);
    ValueError naming key_log_scale and the expected shape otherwise. Shapes only: no host sync. O(1)
    (an expanded view).

        >>> import torch
        >>> from fast.validation import check_key_log_scale
        >>> tuple(check_key_log_scale(torch.zeros(1, 3, 1), torch.ones(2, 3, 4), 3).shape)
        (2, 3)
    """
    lead = tuple(phi_k.shape[:-2])
    ok = isinstance(c, torch.Tensor) and c.is_floating_point() and c.dim() >= 2 and tuple(c.shape[-2:]) == (n, 1)
    if ok:
        try:
            ok = broadcast_shape(tuple(c.shape[:-2]), lead) == lead
        except ValueError:
            ok = False
    if not ok:
        got = tuple(c.shape) if isinstance(c, torch.Tensor) else type(c).__name__
        raise ValueError(f"key_log_scale must be a floating tensor (..., N, 1) = (..., {n}, 1) whose leading dims "
                         f"broadcast to phi_k's {lead}, got {got}")
    return c.detach().to(device=phi_k.device, dtype=phi_k.dtype).squeeze(-1).expand(*lead, n)


def check_diffusion_time(lam: object, *, positive: bool = False) -> "float | torch.Tensor":
    """A finite diffusion time lam >= 0 (> 0 with ``positive``): a real number (Python, NumPy, a 0-d
    array) -> float; a one-element real tensor of any shape -> itself (floating: kept as given, never
    a view, so a learnable lam is the leaf an optimiser updates; integer: converted to float).
    Callers reshape it where they use it. ValueError naming lam otherwise (DiffusionMask,
    HypercubeDiffusionMask). O(1) (one host read for a tensor).

        >>> import numpy as np
        >>> from fast.validation import check_diffusion_time
        >>> check_diffusion_time(np.float64(2)), check_diffusion_time(0.0)
        (2.0, 0.0)
        >>> check_diffusion_time(0.0, positive=True)
        Traceback (most recent call last):
        ...
        ValueError: lam must be a positive finite diffusion time, got 0.0
    """
    scalar = "a positive real scalar" if positive else "a real scalar >= 0"
    time = "a positive finite diffusion time" if positive else "a finite diffusion time >= 0"

    def bad(value: float) -> bool:
        return not math.isfinite(value) or (value <= 0 if positive else value < 0)

    if isinstance(lam, np.ndarray) and lam.ndim == 0 and lam.dtype.kind in "iuf":
        lam = lam.item()
    if isinstance(lam, torch.Tensor):
        if lam.numel() != 1 or lam.is_complex() or lam.dtype == torch.bool:
            raise ValueError(f"lam must be {scalar} (a number or a one-element real tensor), got a "
                             f"tensor of shape {tuple(lam.shape)} and dtype {lam.dtype}")
        value = float(lam.detach())
        if bad(value):
            raise ValueError(f"lam must be {time}, got a tensor holding {value!r}")
        return lam if lam.is_floating_point() else value
    if isinstance(lam, bool) or not isinstance(lam, numbers.Real):
        raise ValueError(f"lam must be {time} (a real number or a one-element tensor), "
                         f"got {type(lam).__name__} {lam!r}")
    if bad(float(lam)):
        raise ValueError(f"lam must be {time}, got {lam!r}")
    return float(lam)


def check_device(name: str, device: object) -> torch.device:
    """``device`` as a torch.device (a torch.device, a string such as "cuda:0", or a CUDA index);
    TypeError / ValueError naming ``name`` otherwise (torch's own says only "Expected one of cpu,
    cuda, ..."). O(1).

        >>> from fast.validation import check_device
        >>> check_device("device", "cpu")
        device(type='cpu')
        >>> check_device("device", "gpu0")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: device must name a torch device (e.g. "cpu", "cuda:0" or torch.device(...)), got 'gpu0' (...)
    """
    if isinstance(device, torch.device):
        return device
    if isinstance(device, bool) or not isinstance(device, (str, numbers.Integral)):
        raise TypeError(f"{name} must be a torch.device, a device string or a CUDA index, got "
                        f"{type(device).__name__} {device!r}")
    try:
        return torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ValueError(f'{name} must name a torch device (e.g. "cpu", "cuda:0" or torch.device(...)), got '
                         f"{device!r} ({str(exc).splitlines()[0][:80]})") from None


def memory_limit(device: "torch.device | str | None" = None) -> int:
    """The bytes one allocation may take on ``device`` before fast/ refuses it: the CUDA device's
    total memory (torch.cuda.get_device_properties), else the machine's physical RAM (os.sysconf;
    2^63 where the platform does not say). O(1).

        >>> from fast.validation import memory_limit
        >>> memory_limit("cpu") > 2**20
        True
    """
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows): no limit of our own
        return 2**63


def _bytes(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


def check_allocation(argument: str, shape: "tuple[int, ...] | int", dtype: torch.dtype, device=None, *,
                     what: str = "an array", copies: int = 1) -> int:
    """The bytes of ``copies`` arrays of ``shape`` and ``dtype``, refused before anything is allocated
    when they pass ``memory_limit(device)``: the one size check of fast/ for counts a caller passes
    (a node count, walkers per node, Gumbel samples, a series length). Computed with Python ints, so
    no size overflows. ``argument`` names what the caller passed ("n_walkers = 10**15"). O(len(shape)).

    Raises MemoryError naming the argument, the array, the bytes it would need and the limit (the
    same type as reference.check_dense_budget, so a size sweep stops there alike).

        >>> import torch
        >>> from fast.validation import check_allocation
        >>> check_allocation("n = 10", (11,), torch.int64)
        88
        >>> check_allocation("n = 2**60", (2**60 + 1,), torch.int64, what="the row pointers")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        MemoryError: n = 2**60 asks for the row pointers of shape (1152921504606846977,) (torch.int64): 8.39e+06 TiB, ...
    """
    dims = (int(shape),) if isinstance(shape, numbers.Integral) else tuple(int(s) for s in shape)
    need = math.prod(dims) * dtype.itemsize * int(copies)
    limit = memory_limit(device)
    if need > limit:
        where = "the device's memory" if torch.device("cpu" if device is None else device).type == "cuda" \
            else "this machine's memory (RAM)"
        times = f"{copies} x " if copies != 1 else ""
        raise MemoryError(f"{argument} asks for {times}{what} of shape {dims} ({dtype}): {_bytes(need)}, more than "
                          f"{where}, {_bytes(limit)}")
    return need
