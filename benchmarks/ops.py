"""The operations of the peer suite and every library's call of them, in its native layout.

Nine operations, each computed by maskbench and by one peer on the same inputs:

    op                 maskbench call (one function each, below)              peer
    favor              fast.favor_attention(q, k, v, W)                       performer-pytorch: softmax_kernel(eps=0)
                                                                              + its linear_attention
    favor-causal       fast.favor_attention(q, k, v, W, mask=CausalMask(N))   performer-pytorch: softmax_kernel(eps=0)
                                                                              + its causal_linear_attention(eps=0),
                                                                              which runs fast-transformers' C++
                                                                              causal_dot_product
    elu                fast.masked_linear_attention(EluPlusOne()(q), ...,     fast-transformers LinearAttention(eps=0)
                       features_nonnegative=True)
    elu-causal         ... mask=CausalMask(N)                                 fast-transformers CausalLinearAttention(eps=0)
    linear-causal      fast.masked_linear_attention(phi_q, phi_k, v,          fla-core chunk_linear_attn(phi_q, phi_k, v,
                       mask=CausalMask(N), features_nonnegative=True) on      scale=1, normalize=True) (CUDA only)
                       given features phi = elu + 1 of q and k (untimed)
    softmax            fast.softmax_attention(q, k, v)                        torch SDPA, torch's own backend choice
    softmax-flash      the same                                               torch SDPA under sdpa_kernel(FLASH_ATTENTION)
    softmax-efficient  the same                                               ... sdpa_kernel(EFFICIENT_ATTENTION)
    softmax-math       the same                                               ... sdpa_kernel(MATH)

Shapes: maskbench, performer-pytorch and torch SDPA take q, k, v as (B, H, N, d) (batch, heads,
tokens, width); fast-transformers and fla-core take (B, N, H, d). Each library gets its native
layout, made contiguous before anything is timed (``prepare``); outputs and gradients are compared
in (B, H, N, d). W (the FAVOR+ projection) is (m, d); for the ELU+1, linear-causal and softmax
operations the feature width m is d (ELU+1's features are the coordinates of q and k).

dtypes (``DTYPES``): every op runs in float32; linear-causal also in bfloat16; softmax-flash only
in bfloat16 and float16 (the flash kernel's types). Inputs are drawn in float32 and rounded once,
so both libraries read the same numbers.

How the functions were made equal (the peers' public functions and arguments only):

- performer-pytorch's ``softmax_kernel`` adds ``eps`` (1e-4 by default) to every stabilised
  feature, which makes its output a different function from FAVOR+ (relative difference ~1 at
  d = m = 64): it is called with ``eps=0``, on the same W. Its feature formula is then
  FAVOR+'s, exp(W x / d^(1/4) - |x|^2 / (2 sqrt(d)) - c) / sqrt(m), with the same stabilisers
  (per-query max; per-(batch, head) max for the keys) up to constants that cancel in the
  attention ratio. Its ``FastAttention`` module cannot pass eps (it always uses 1e-4), so the
  module's two steps are called directly.
- performer-pytorch's causal path: ``causal_linear_attention(q', k', v, eps=0)`` (its default
  eps=1e-6 is added to the running key sums of the denominator), which calls fast-transformers'
  C++ ``CausalDotProduct`` for the numerator. ``FastAttention(causal=True)`` on CPU never selects
  it (its import test looks for the CUDA extension) and falls back to
  ``causal_linear_attention_noncuda``, O(N m d) memory: that fallback is not benchmarked.
- fast-transformers' ``LinearAttention`` and ``CausalLinearAttention`` add ``eps`` (1e-6) to the
  denominator: built with ``eps=0``. Their default feature map is elu(x) + 1. They are called
  with length masks (``LengthMask``, ``TriangularCausalMask``: O(N) lengths), never with
  ``FullMask``, which would build an N x N boolean.
- fla-core's ``chunk_linear_attn(q, k, v, scale, normalize=True)`` computes
  o_i = (scale q_i^T sum_{j<=i} k_j v_j^T) / (scale q_i^T sum_{j<=i} k_j + 1e-10) on the
  features it is given: maskbench's causal ratio on the same phi_q, phi_k, with scale = 1 so that
  its numerator is maskbench's too, and an absolute 1e-10 in the denominator, relatively below
  1e-9 for elu + 1 features (each denominator is a sum of products of positive features, at
  least phi(q_i) . phi(k_0) ~ 1), far inside the tolerance. normalize=False would give the
  numerator alone, a different function (tests/benchmarks/test_fla_interpret.py shows the check
  refusing it). Its kernels are Triton GPU kernels: CUDA only.
- torch SDPA's backends are chosen with ``torch.nn.attention.sdpa_kernel``; where a backend
  cannot run (the memory-efficient one on a CPU, flash in float32 on CUDA), the op is skipped
  with the error torch raises.

Never copies a peer's code: only its public functions are called.
"""
from __future__ import annotations

import functools
import importlib.metadata
import math
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

import fast

OPS = ("favor", "favor-causal", "elu", "elu-causal", "linear-causal", "softmax", "softmax-flash", "softmax-efficient",
       "softmax-math")
PASSES = ("forward", "forward+backward")
MASKBENCH = "maskbench"
PERFORMER = "performer-pytorch"
FAST_TRANSFORMERS = "pytorch-fast-transformers"
FLA = "fla-core"
SDPA = "torch-sdpa"
SDPA_FLASH = "torch-sdpa-flash"
SDPA_EFFICIENT = "torch-sdpa-efficient"
SDPA_MATH = "torch-sdpa-math"
#: the one peer of each operation (favor-causal's numerator is fast-transformers' C++ kernel,
#: reached through performer-pytorch's causal_linear_attention: both must be installed)
PEER_OF = {"favor": PERFORMER, "favor-causal": PERFORMER, "elu": FAST_TRANSFORMERS, "elu-causal": FAST_TRANSFORMERS,
           "linear-causal": FLA, "softmax": SDPA, "softmax-flash": SDPA_FLASH, "softmax-efficient": SDPA_EFFICIENT,
           "softmax-math": SDPA_MATH}
#: the libraries each operation's peer needs, besides torch (an SDPA backend is probed: library_unavailable)
NEEDS = {"favor": (PERFORMER,), "favor-causal": (PERFORMER, FAST_TRANSFORMERS), "elu": (FAST_TRANSFORMERS,),
         "elu-causal": (FAST_TRANSFORMERS,), "linear-causal": (FLA,), "softmax": (), "softmax-flash": (SDPA_FLASH,),
         "softmax-efficient": (SDPA_EFFICIENT,), "softmax-math": (SDPA_MATH,)}
#: the SDPA backend (a torch.nn.attention.SDPBackend member name) of each explicit-backend peer
SDPA_BACKEND = {SDPA_FLASH: "FLASH_ATTENTION", SDPA_EFFICIENT: "EFFICIENT_ATTENTION", SDPA_MATH: "MATH"}
DTYPE_OF_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: the dtypes each operation is benchmarked in. performer-pytorch's features and fast-transformers'
#: kernels are float32 work; fla-core's linear attention is bfloat16 work too, but not float16: its
#: running key sums (the denominator's, held in the input dtype) pass float16's largest value
#: 65504 near N = 2^16 (N tokens times ~1.3 per elu + 1 feature); the flash kernel takes half types only.
DTYPES = {"favor": ("float32",), "favor-causal": ("float32",), "elu": ("float32",), "elu-causal": ("float32",),
          "linear-causal": ("float32", "bfloat16"), "softmax": ("float32",), "softmax-flash": ("bfloat16", "float16"),
          "softmax-efficient": ("float32",), "softmax-math": ("float32",)}
#: softmax attention is quadratic in time: N above this is not benchmarked (per device: a GPU's
#: flash and memory-efficient kernels keep O(N) memory and reach 2^16 in seconds). The math
#: backend holds the N x N matrix (and its gradient) whatever the device: 2^13 everywhere.
SOFTMAX_MAX_N = {"cpu": 2 ** 13, "cuda": 2 ** 16}
SOFTMAX_MATH_MAX_N = 2 ** 13
INSTALL = {
    PERFORMER: 'pip install -e ".[peers]" (performer-pytorch==1.1.4, einops)',
    FAST_TRANSFORMERS: ("with no nvcc on PATH, pip install --no-build-isolation pytorch-fast-transformers==0.4.0 "
                        "into this venv (compiles C++, a few minutes)"),
    FLA: 'pip install -e ".[gpu-peers]" (fla-core==0.6.0; needs triton, which CUDA builds of torch bring)',
}
DISTRIBUTION = {PERFORMER: "performer-pytorch", FAST_TRANSFORMERS: "pytorch-fast-transformers", FLA: "fla-core"}
#: fla-core's causal linear attention kernels (``<name>_linear_attn``); "chunk" is the one timed
FLA_KERNELS = ("chunk", "fused_chunk", "fused_recurrent")


def max_n(op: str, device: str | torch.device = "cpu") -> int | None:
    """The largest N benchmarked for ``op`` on ``device`` (None: no limit; quadratic ops only)."""
    if op == "softmax-math":
        return SOFTMAX_MATH_MAX_N
    if op.startswith("softmax"):
        return SOFTMAX_MAX_N.get(torch.device(device).type, SOFTMAX_MAX_N["cpu"])
    return None


def dtype_name(dtype: torch.dtype) -> str:
    """"float32", "bfloat16", "float16" (str(dtype) without "torch.")."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Size:
    """B batch, H heads, N tokens, d width of q, k and v, m FAVOR+ features (= d for elu, softmax)."""

    B: int
    H: int
    N: int
    d: int
    m: int


@dataclass(frozen=True)
class Problem:
    """The shared inputs, in maskbench's layout: q, k, v, cotangent (B, H, N, d) in the problem's
    dtype; projection W (m, d), float32."""

    size: Size
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cotangent: torch.Tensor
    projection: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.q.dtype


def make_problem(size: Size, device: str | torch.device = "cpu", seed: int = 0,
                 dtype: torch.dtype = torch.float32) -> Problem:
    """Seeded inputs: q, k, v, cotangent with N(0, 1) entries; W from fast.gaussian_projection
    (orthogonal rows, Performer's default kind). Drawn in float32 on the CPU from one explicit
    generator, rounded to ``dtype`` (q, k, v, cotangent; W stays float32), then moved to ``device``,
    so every device and every library sees the same numbers, and a half-precision problem holds
    the float32 problem's values rounded once."""
    if dtype not in DTYPE_OF_NAME.values():
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_OF_NAME)}, got {dtype}")
    g = torch.Generator().manual_seed(seed)
    shape = (size.B, size.H, size.N, size.d)
    q, k, v, cot = (torch.randn(shape, generator=g, dtype=torch.float32).to(dtype) for _ in range(4))
    w = fast.gaussian_projection(size.m, size.d, orthogonal=True, generator=g, dtype=torch.float32)
    q, k, v, cot, w = (t.to(device) for t in (q, k, v, cot, w))
    return Problem(size, q, k, v, cot, w)


# --- maskbench: one small function per operation (the calls the suite times) -----------------

def maskbench_favor(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """FAVOR+ attention, unmasked: (B, H, N, d) -> (B, H, N, d)."""
    return fast.favor_attention(q, k, v, projection)


def maskbench_favor_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor,
                           mask: fast.CausalMask) -> torch.Tensor:
    """FAVOR+ attention under the causal mask M_ij = [j <= i]: (B, H, N, d) -> (B, H, N, d)."""
    return fast.favor_attention(q, k, v, projection, mask=mask)


#: maskbench's ELU+1 feature map, elu(x) + 1 (fast.EluPlusOne: exp(min(x, 0)) + max(x, 0), positive)
_ELU_PLUS_ONE = fast.EluPlusOne()


def maskbench_elu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Linear attention with ELU+1 features phi(x) = elu(x) + 1 (m = d): (B, H, N, d) -> (B, H, N, d).

    As a user writes it: fast.EluPlusOne's features, which are positive, so the guard is told so
    (features_nonnegative=True) instead of testing their sign (docs/papers.md, fast.attention)."""
    return fast.masked_linear_attention(_ELU_PLUS_ONE(q), _ELU_PLUS_ONE(k), v, features_nonnegative=True)


def maskbench_elu_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: fast.CausalMask) -> torch.Tensor:
    """Causal linear attention with ELU+1 features: (B, H, N, d) -> (B, H, N, d); as maskbench_elu."""
    return fast.masked_linear_attention(_ELU_PLUS_ONE(q), _ELU_PLUS_ONE(k), v, mask=mask, features_nonnegative=True)


def maskbench_linear_causal(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                            mask: fast.CausalMask) -> torch.Tensor:
    """Causal linear attention on given nonnegative features: phi_q, phi_k (B, H, N, m), v (B, H, N, d)
    -> (B, H, N, d), out_i = phi_q_i^T sum_{j<=i} phi_k_j v_j^T / phi_q_i^T sum_{j<=i} phi_k_j."""
    return fast.masked_linear_attention(phi_q, phi_k, v, mask=mask, features_nonnegative=True)


def maskbench_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Exact softmax attention softmax(q k^T / sqrt(d)) v: (B, H, N, d) -> (B, H, N, d)."""
    return fast.softmax_attention(q, k, v)


# --- the peers ----------------------------------------------------------------------------------

def _quiet_import(name: str):
    # performer-pytorch imports distutils and torch.cuda.amp.autocast, both deprecated: their
    # warnings say nothing about the benchmark
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


def peer_version(library: str) -> str | None:
    """The installed version of a peer library (performer-pytorch, pytorch-fast-transformers, fla-core), or None."""
    try:
        return importlib.metadata.version(DISTRIBUTION[library])
    except importlib.metadata.PackageNotFoundError:
        return None


def _import_failure(library: str, module: str, err: ImportError) -> str:
    """The skip message for a peer that cannot be imported: not installed, or installed but broken."""
    missing = isinstance(err, ModuleNotFoundError) and (err.name or "").split(".")[0] == module
    state = "not installed" if missing else f"installed but cannot be imported ({err})"
    return f"{library} {state}: {INSTALL[library]} (docs/benchmarks.md)"


def _sdpa_backend(library: str):
    from torch.nn.attention import SDPBackend
    return getattr(SDPBackend, SDPA_BACKEND[library])


def _sdpa_unavailable(library: str, device: torch.device, dtype: torch.dtype, d: int) -> str | None:
    """Why torch cannot run ``library``'s SDPA backend here: torch's own error of a tiny forward and
    backward (B = H = 1, N = 8, width d) under ``sdpa_kernel``, with the reasons it warns, or None."""
    try:
        from torch.nn.attention import sdpa_kernel
        backend = _sdpa_backend(library)
    except (ImportError, AttributeError) as err:
        return f"{library}: torch {torch.__version__} cannot select SDPA backends ({err})"
    x = torch.zeros(1, 1, 8, d, device=device, dtype=dtype, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(x, x, x).sum().backward()
        except RuntimeError as err:
            said = " ".join(dict.fromkeys(str(w.message).strip() for w in caught))
            return (f"{library} cannot run on {device.type} in {dtype_name(dtype)} at d = {d}; torch says: "
                    f"{str(err).strip()}" + (f" ({said})" if said else ""))
    return None


def library_unavailable(library: str, device: str | torch.device = "cpu", causal: bool = False,
                        dtype: torch.dtype = torch.float32, d: int = 16) -> str | None:
    """Why ``library`` cannot run here (a message saying what to install, or torch's error), or None.

    causal: fast-transformers' causal kernel is needed (a CPU-only build has no CUDA kernel).
    dtype, d: the inputs' dtype and width (an SDPA backend is probed with them)."""
    device = torch.device(device)
    if library == PERFORMER:
        try:
            _quiet_import("performer_pytorch.performer_pytorch")
        except ImportError as err:
            return _import_failure(PERFORMER, "performer_pytorch", err)
        return None
    if library == FAST_TRANSFORMERS:
        try:
            _quiet_import("fast_transformers.masking")
            _quiet_import("fast_transformers.attention.linear_attention")
            _quiet_import("fast_transformers.attention.causal_linear_attention")
            causal_product = _quiet_import("fast_transformers.causal_product")
        except ImportError as err:
            return _import_failure(FAST_TRANSFORMERS, "fast_transformers", err)
        if causal and causal_product.CausalDotProduct.dot.get(device.type) is None:
            return (f"{FAST_TRANSFORMERS} has no {device.type} causal_dot_product kernel (built without it; CUDA needs "
                    "nvcc at build time): causal peers skipped on this device")
        return None
    if library == FLA:
        if device.type != "cuda":
            # its CPU path is Triton's interpreter, for tests (tests/benchmarks/test_fla_interpret.py), not for timing
            return (f"{FLA} runs Triton GPU kernels: it needs --device cuda, got {device.type} "
                    f"({INSTALL[FLA]})")
        try:
            _quiet_import("fla.ops.linear_attn")
        except ImportError as err:
            return _import_failure(FLA, "fla", err)
        return None
    if library in SDPA_BACKEND:
        return _sdpa_unavailable(library, device, dtype, d)
    return None


def op_unavailable(op: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                   d: int = 16) -> str | None:
    """Why the peer of ``op`` cannot run here (on ``dtype`` inputs of width ``d``), or None."""
    for library in NEEDS[op]:
        why = library_unavailable(library, device, causal=op.endswith("causal"), dtype=dtype, d=d)
        if why is not None:
            return why
    return None


def _performer():
    return _quiet_import("performer_pytorch.performer_pytorch")


def performer_favor(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor,
                    pp=None) -> torch.Tensor:
    """performer-pytorch FAVOR+: softmax_kernel with eps=0 on W, then its linear_attention. (B, H, N, d).

    pp: the module performer_pytorch.performer_pytorch (imported here when None; ``prepare``
    passes it so that no import machinery runs inside the timed call)."""
    pp = _performer() if pp is None else pp
    phi_q = pp.softmax_kernel(q, projection_matrix=projection, is_query=True, eps=0.0)
    phi_k = pp.softmax_kernel(k, projection_matrix=projection, is_query=False, eps=0.0)
    return pp.linear_attention(phi_q, phi_k, v)


def performer_favor_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor,
                           pp=None) -> torch.Tensor:
    """performer-pytorch causal FAVOR+: softmax_kernel (eps=0), causal_linear_attention (eps=0), whose
    numerator is fast-transformers' C++ causal_dot_product. (B, H, N, d); pp as in performer_favor."""
    pp = _performer() if pp is None else pp
    phi_q = pp.softmax_kernel(q, projection_matrix=projection, is_query=True, eps=0.0)
    phi_k = pp.softmax_kernel(k, projection_matrix=projection, is_query=False, eps=0.0)
    return pp.causal_linear_attention(phi_q, phi_k, v, eps=0.0)


def fla_linear_causal(phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, kernel=None) -> torch.Tensor:
    """fla-core's causal linear attention on given features, normalised: (B, N, H, m), (B, N, H, m),
    (B, N, H, d) -> (B, N, H, d).

    kernel: one of fla.ops.linear_attn's ``chunk_linear_attn`` (None: that one, imported here),
    ``fused_chunk_linear_attn``, ``fused_recurrent_linear_attn``, called as
    kernel(phi_q, phi_k, v, scale=1.0, normalize=True): the ratio of the module doc, its numerator
    unscaled; its final state is not asked for."""
    if kernel is None:
        kernel = _quiet_import("fla.ops.linear_attn").chunk_linear_attn
    out, _ = kernel(phi_q, phi_k, v, scale=1.0, output_final_state=False, normalize=True)
    return out


def sdpa_with_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend) -> torch.Tensor:
    """torch's scaled_dot_product_attention(q, k, v) with the one backend ``backend`` (an SDPBackend)
    allowed: (B, H, N, d) -> (B, H, N, d). The backward runs the kernel the forward chose."""
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v)


def _fast_transformers_module(op: str, size: Size, device: torch.device) -> Callable[..., torch.Tensor]:
    """fast-transformers' attention module for op ("elu" or "elu-causal"), eps=0, ELU+1 features,
    bound to O(N) length masks: a function of (q, k, v) in (B, N, H, d)."""
    masking = _quiet_import("fast_transformers.masking")
    full = torch.full((size.B,), size.N, dtype=torch.long, device=device)
    lengths = masking.LengthMask(full, max_len=size.N)  # every sample has all N tokens
    if op == "elu":
        linear = _quiet_import("fast_transformers.attention.linear_attention")
        module = linear.LinearAttention(size.d, eps=0.0)
        # the all-ones N x N attention mask, held as N lengths of N (LinearAttention only reads .all_ones)
        attn_mask = masking.LengthMask(torch.full((size.N,), size.N, dtype=torch.long, device=device),
                                       max_len=size.N)
    elif op == "elu-causal":
        causal = _quiet_import("fast_transformers.attention.causal_linear_attention")
        module = causal.CausalLinearAttention(size.d, eps=0.0)
        attn_mask = masking.TriangularCausalMask(size.N, device=device)
    else:
        raise ValueError(f"op must be 'elu' or 'elu-causal' for fast-transformers, got {op!r}")
    module = module.to(device)
    return functools.partial(module, attn_mask=attn_mask, query_lengths=lengths, key_lengths=lengths)


# --- one library's call, prepared -----------------------------------------------------------------

@dataclass
class Prepared:
    """One library's call of one operation with its inputs in its native layout.

    call(q, k, v) -> out, all in ``layout`` ("BHNd": (B, H, N, d); "BNHd": (B, N, H, d)).
    q, k, v are leaves (requires_grad for forward+backward); cotangent is the output's."""

    library: str
    call: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cotangent: torch.Tensor
    layout: str = "BHNd"

    def to_common(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor of this library's layout in (B, H, N, d)."""
        return t if self.layout == "BHNd" else t.transpose(1, 2)


def prepare(op: str, library: str, problem: Problem, requires_grad: bool, fla_kernel: str = "chunk") -> Prepared:
    """``library``'s call of ``op`` on ``problem``'s inputs, copied into its native layout (untimed).

    linear-causal takes features: its q and k are elu(q) + 1 and elu(k) + 1 of the problem's, computed
    here. fla_kernel: which of fla-core's kernels (FLA_KERNELS) is fla-core's call."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if fla_kernel not in FLA_KERNELS:
        raise ValueError(f"fla_kernel must be one of {FLA_KERNELS}, got {fla_kernel!r}")
    size, w = problem.size, problem.projection
    device = problem.q.device
    layout = "BNHd" if library in (FAST_TRANSFORMERS, FLA) else "BHNd"
    q, k = problem.q, problem.k
    if op == "linear-causal":
        q, k = _ELU_PLUS_ONE(q), _ELU_PLUS_ONE(k)

    def native(t: torch.Tensor, leaf: bool) -> torch.Tensor:
        t = t.detach().transpose(1, 2).contiguous() if layout == "BNHd" else t.detach().clone()
        return t.requires_grad_(leaf)

    if library == MASKBENCH:
        causal = fast.CausalMask(size.N)
        call = {"favor": functools.partial(maskbench_favor, projection=w),
                "favor-causal": functools.partial(maskbench_favor_causal, projection=w, mask=causal),
                "elu": maskbench_elu,
                "elu-causal": functools.partial(maskbench_elu_causal, mask=causal),
                "linear-causal": functools.partial(maskbench_linear_causal, mask=causal)}.get(op, maskbench_softmax)
    elif library != PEER_OF[op]:
        raise ValueError(f"the peer of {op!r} is {PEER_OF[op]!r} (or {MASKBENCH!r}), got library={library!r}")
    elif library == PERFORMER:
        call = functools.partial(performer_favor if op == "favor" else performer_favor_causal, projection=w,
                                 pp=_performer())
    elif library == FAST_TRANSFORMERS:
        call = _fast_transformers_module(op, size, device)
    elif library == FLA:
        kernel = getattr(_quiet_import("fla.ops.linear_attn"), f"{fla_kernel}_linear_attn")
        call = functools.partial(fla_linear_causal, kernel=kernel)
    elif library in SDPA_BACKEND:
        call = functools.partial(sdpa_with_backend, backend=_sdpa_backend(library))
    else:  # torch-sdpa: torch's own choice of backend
        call = F.scaled_dot_product_attention
    return Prepared(library, call, native(q, requires_grad), native(k, requires_grad),
                    native(problem.v, requires_grad), native(problem.cotangent, False), layout)


def timed_call(prep: Prepared, pass_: str) -> Callable[[], object]:
    """The function pytest-benchmark times: the forward, or forward + backward (the gradients of
    sum(out * cotangent) with respect to q, k and v). On CUDA it synchronises before returning."""
    if pass_ not in PASSES:
        raise ValueError(f"pass_ must be one of {PASSES}, got {pass_!r}")
    call, q, k, v, cot = prep.call, prep.q, prep.k, prep.v, prep.cotangent
    sync = torch.cuda.synchronize if q.device.type == "cuda" else (lambda: None)
    if pass_ == "forward":
        def forward() -> torch.Tensor:
            out = call(q, k, v)
            sync()
            return out
        return forward

    def forward_backward() -> tuple[torch.Tensor, ...]:
        out = call(q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), grad_outputs=cot)
        sync()
        return grads
    return forward_backward


def peak_memory(call: Callable[[], object], device: str | torch.device) -> tuple[int | None, int | None]:
    """(peak, extra): the GPU memory of one call of ``call`` (a timed_call function) on a CUDA device,
    in bytes. peak: torch.cuda.max_memory_allocated after torch.cuda.reset_peak_memory_stats, so it
    counts every live tensor (the problem's inputs and the library's prepared copies too); extra:
    that peak less torch.cuda.memory_allocated just before the call (what the call itself needed at
    its peak, its outputs included). Tensors torch allocated, not the caching allocator's reserve
    (nor nvidia-smi's view). (None, None) on any other device."""
    device = torch.device(device)
    if device.type != "cuda":
        return None, None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = call()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del out
    return int(peak), int(peak - before)


def results(prep: Prepared, pass_: str) -> dict[str, torch.Tensor]:
    """The output (and for forward+backward the gradients dq, dk, dv) in (B, H, N, d), detached."""
    out = prep.call(prep.q, prep.k, prep.v)
    got = {"out": out}
    if pass_ == "forward+backward":
        dq, dk, dv = torch.autograd.grad(out, (prep.q, prep.k, prep.v), grad_outputs=prep.cotangent)
        got.update(dq=dq, dk=dk, dv=dv)
    return {name: prep.to_common(t).detach() for name, t in got.items()}


# --- the same function ------------------------------------------------------------------------------

def tolerance(size: Size, pass_: str, dtype: torch.dtype = torch.float32) -> float:
    """The largest relative Frobenius difference accepted between two computations of one function.

        forward:          16 u (sqrt(N m) + d)
        forward+backward: 64 u (sqrt(N m) + d)      u = the dtype's unit round-off (2^-24 in float32)

    Each output is a ratio of sums over N keys of m-term products (and the softmax's d-term
    logits), summed in different orders and blockings by the two libraries: the probabilistic
    round-off bound of such a sum is about u sqrt(N m) relative to its absolute terms (the
    bound the maskbench guard uses too, fast.attention), and the features' exponents carry an
    absolute error of about u d, which exp turns into a relative one. 16 allows a factor ~8 for
    each of the two computations; gradients compose two more such products (x 4). At
    N = 2^16, m = 64 the forward bound is 2e-3, far below what a different function gives
    (performer's eps = 1e-4: relative difference ~1 at d = m = 64), and far above what the same
    function gives (~1e-6).

    float16 and bfloat16 (u_h = 2^-11, 2^-8; ``compare``): the peer's half-precision result is
    compared with maskbench's float32 result on the same rounded inputs. The peer sums in float32
    (the bound above with float32's u) and rounds a few intermediates (flash attention's
    probabilities, fla's chunk states and key sums) and its output to the half type: each
    rounding moves the entries it touches by at most u_h relatively, and with independent
    rounding errors the output by about u_h relatively. 8 u_h allows eight such roundings on the
    forward path; the backward composes two more products (x 4): 32 u_h. In bfloat16 that is
    3.1e-2 (forward) and 0.125: it still tells a different function (an O(1) difference) from
    the same one, but no longer a change as small as an eps of 1e-4.
    """
    factor = 16.0 if pass_ == "forward" else 64.0
    half = dtype in (torch.float16, torch.bfloat16)
    u = torch.finfo(torch.float32 if half else dtype).eps / 2
    bound = factor * u * (math.sqrt(size.N * size.m) + size.d)
    if half:
        bound += factor / 2 * torch.finfo(dtype).eps / 2
    return bound


def relative_difference(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref||_F / ||ref||_F in float64 (inf if x has a NaN or inf, or ref is 0 while x is not)."""
    x, ref = x.detach().double(), ref.detach().double()
    if not bool(torch.isfinite(x).all()):
        return math.inf
    num, den = float((x - ref).norm()), float(ref.norm())
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


@dataclass(frozen=True)
class Equivalence:
    """The peer's and maskbench's results on the same inputs: the relative Frobenius difference of
    each (out; dq, dk, dv for forward+backward), their max, and the tolerance it must stay within."""

    op: str
    pass_: str
    peer: str
    size: Size
    diffs: dict
    tolerance: float
    dtype: str = "float32"

    @property
    def max_rel_diff(self) -> float:
        return max(self.diffs.values())

    @property
    def same(self) -> bool:
        return self.max_rel_diff <= self.tolerance

    def message(self) -> str:
        parts = ", ".join(f"{k} {v:.2e}" for k, v in self.diffs.items())
        verdict = "<=" if self.same else "EXCEEDS"
        return (f"{self.op} {self.pass_} {self.peer} vs {MASKBENCH} at {self.size} in {self.dtype}: relative "
                f"Frobenius difference {parts}; max {self.max_rel_diff:.2e} {verdict} tolerance {self.tolerance:.2e}")


def compare(op: str, pass_: str, problem: Problem, fla_kernel: str = "chunk") -> Equivalence:
    """Run maskbench and the op's peer on ``problem`` (untimed) and measure how far apart they are.

    A float16 or bfloat16 problem: the peer runs in it, maskbench in float32 on the same rounded
    inputs (where maskbench's own call is torch's SDPA, its half-precision result would be the
    peer's, bit for bit, and show nothing), against ``tolerance``'s half-precision bound.
    fla_kernel: as in ``prepare``."""
    peer = PEER_OF[op]
    want = pass_ == "forward+backward"
    reference = problem
    if problem.dtype in (torch.float16, torch.bfloat16):
        reference = Problem(problem.size, *(t.float() for t in (problem.q, problem.k, problem.v, problem.cotangent)),
                            problem.projection)
    mine = results(prepare(op, MASKBENCH, reference, want), pass_)
    theirs = results(prepare(op, peer, problem, want, fla_kernel=fla_kernel), pass_)
    diffs = {name: relative_difference(theirs[name], mine[name]) for name in mine}
    return Equivalence(op, pass_, peer, problem.size, diffs, tolerance(problem.size, pass_, problem.dtype),
                       dtype_name(problem.dtype))
