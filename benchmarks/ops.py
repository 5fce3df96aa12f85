"""The operations of the peer suite and every library's call of them, in its native layout.

Five operations, each computed by maskbench and by one peer on the same inputs:

    op            maskbench call (one function each, below)                 peer
    favor         fast.favor_attention(q, k, v, W)                          performer-pytorch: softmax_kernel(eps=0)
                                                                              + its linear_attention
    favor-causal  fast.favor_attention(q, k, v, W, mask=CausalMask(N))      performer-pytorch: softmax_kernel(eps=0)
                                                                              + its causal_linear_attention(eps=0),
                                                                              which runs fast-transformers' C++
                                                                              causal_dot_product
    elu           fast.masked_linear_attention(EluPlusOne()(q), ...,        fast-transformers LinearAttention(eps=0)
                  features_nonnegative=True)
    elu-causal    ... mask=CausalMask(N)                                    fast-transformers CausalLinearAttention(eps=0)
    softmax       fast.softmax_attention(q, k, v)                           torch.nn.functional.scaled_dot_product_attention

Shapes: maskbench, performer-pytorch and torch SDPA take q, k, v as (B, H, N, d) (batch, heads,
tokens, width); fast-transformers takes (B, N, H, d). Each library gets its native layout,
made contiguous before anything is timed (``prepare``); outputs and gradients are compared in
(B, H, N, d). W (the FAVOR+ projection) is (m, d); for the ELU+1 and softmax operations the
feature width m is d (ELU+1's features are the coordinates of q and k).

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

OPS = ("favor", "favor-causal", "elu", "elu-causal", "softmax")
PASSES = ("forward", "forward+backward")
MASKBENCH = "maskbench"
PERFORMER = "performer-pytorch"
FAST_TRANSFORMERS = "pytorch-fast-transformers"
SDPA = "torch-sdpa"
#: the one peer of each operation (favor-causal's numerator is fast-transformers' C++ kernel,
#: reached through performer-pytorch's causal_linear_attention: both must be installed)
PEER_OF = {"favor": PERFORMER, "favor-causal": PERFORMER, "elu": FAST_TRANSFORMERS, "elu-causal": FAST_TRANSFORMERS,
           "softmax": SDPA}
#: the libraries each operation's peer needs, besides torch
NEEDS = {"favor": (PERFORMER,), "favor-causal": (PERFORMER, FAST_TRANSFORMERS), "elu": (FAST_TRANSFORMERS,),
         "elu-causal": (FAST_TRANSFORMERS,), "softmax": ()}
#: softmax attention is quadratic: N above this is not benchmarked
SOFTMAX_MAX_N = 2 ** 13
INSTALL = {
    PERFORMER: 'pip install -e ".[peers]" (performer-pytorch==1.1.4, einops)',
    FAST_TRANSFORMERS: ("with no nvcc on PATH, pip install --no-build-isolation pytorch-fast-transformers==0.4.0 "
                        "into this venv (compiles C++, a few minutes)"),
}
DISTRIBUTION = {PERFORMER: "performer-pytorch", FAST_TRANSFORMERS: "pytorch-fast-transformers"}


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
    """The shared inputs, in maskbench's layout: q, k, v, cotangent (B, H, N, d); projection W (m, d)."""

    size: Size
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cotangent: torch.Tensor
    projection: torch.Tensor


def make_problem(size: Size, device: str | torch.device = "cpu", seed: int = 0) -> Problem:
    """Seeded float32 inputs: q, k, v, cotangent with N(0, 1) entries; W from fast.gaussian_projection
    (orthogonal rows, Performer's default kind). Drawn on the CPU from one explicit generator,
    then moved to ``device``, so every device and every library sees the same numbers."""
    g = torch.Generator().manual_seed(seed)
    shape = (size.B, size.H, size.N, size.d)
    q, k, v, cot = (torch.randn(shape, generator=g, dtype=torch.float32) for _ in range(4))
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
    (features_nonnegative=True) instead of testing their sign (fast.attention's module doc)."""
    return fast.masked_linear_attention(_ELU_PLUS_ONE(q), _ELU_PLUS_ONE(k), v, features_nonnegative=True)


def maskbench_elu_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: fast.CausalMask) -> torch.Tensor:
    """Causal linear attention with ELU+1 features: (B, H, N, d) -> (B, H, N, d); as maskbench_elu."""
    return fast.masked_linear_attention(_ELU_PLUS_ONE(q), _ELU_PLUS_ONE(k), v, mask=mask, features_nonnegative=True)


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
    """The installed version of a peer library (performer-pytorch, pytorch-fast-transformers), or None."""
    try:
        return importlib.metadata.version(DISTRIBUTION[library])
    except importlib.metadata.PackageNotFoundError:
        return None


def _import_failure(library: str, module: str, err: ImportError) -> str:
    """The skip message for a peer that cannot be imported: not installed, or installed but broken."""
    missing = isinstance(err, ModuleNotFoundError) and (err.name or "").split(".")[0] == module
    state = "not installed" if missing else f"installed but cannot be imported ({err})"
    return f"{library} {state}: {INSTALL[library]} (docs/benchmarks.md)"


def library_unavailable(library: str, device: str | torch.device = "cpu", causal: bool = False) -> str | None:
    """Why ``library`` cannot run here (a message saying what to install), or None when it can.

    causal: fast-transformers' causal kernel is needed (a CPU-only build has no CUDA kernel)."""
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
        kind = torch.device(device).type
        if causal and causal_product.CausalDotProduct.dot.get(kind) is None:
            return (f"{FAST_TRANSFORMERS} has no {kind} causal_dot_product kernel (built without it; CUDA needs "
                    "nvcc at build time): causal peers skipped on this device")
        return None
    return None


def op_unavailable(op: str, device: str | torch.device = "cpu") -> str | None:
    """Why the peer of ``op`` cannot run here, or None."""
    for library in NEEDS[op]:
        why = library_unavailable(library, device, causal=op.endswith("causal"))
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


def prepare(op: str, library: str, problem: Problem, requires_grad: bool) -> Prepared:
    """``library``'s call of ``op`` on ``problem``'s inputs, copied into its native layout (untimed)."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    size, w = problem.size, problem.projection
    device = problem.q.device
    layout = "BNHd" if library == FAST_TRANSFORMERS else "BHNd"

    def native(t: torch.Tensor, leaf: bool) -> torch.Tensor:
        t = t.detach().transpose(1, 2).contiguous() if layout == "BNHd" else t.detach().clone()
        return t.requires_grad_(leaf)

    if library == MASKBENCH:
        causal = fast.CausalMask(size.N)
        call = {"favor": functools.partial(maskbench_favor, projection=w),
                "favor-causal": functools.partial(maskbench_favor_causal, projection=w, mask=causal),
                "elu": maskbench_elu,
                "elu-causal": functools.partial(maskbench_elu_causal, mask=causal),
                "softmax": maskbench_softmax}[op]
    elif library != PEER_OF[op]:
        raise ValueError(f"the peer of {op!r} is {PEER_OF[op]!r} (or {MASKBENCH!r}), got library={library!r}")
    elif library == PERFORMER:
        call = functools.partial(performer_favor if op == "favor" else performer_favor_causal, projection=w,
                                 pp=_performer())
    elif library == FAST_TRANSFORMERS:
        call = _fast_transformers_module(op, size, device)
    else:  # torch-sdpa
        call = F.scaled_dot_product_attention
    return Prepared(library, call, native(problem.q, requires_grad), native(problem.k, requires_grad),
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
    """The largest relative Frobenius difference accepted between two float computations of one function.

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
    """
    u = torch.finfo(dtype).eps / 2
    factor = 16.0 if pass_ == "forward" else 64.0
    return factor * u * (math.sqrt(size.N * size.m) + size.d)


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

    @property
    def max_rel_diff(self) -> float:
        return max(self.diffs.values())

    @property
    def same(self) -> bool:
        return self.max_rel_diff <= self.tolerance

    def message(self) -> str:
        parts = ", ".join(f"{k} {v:.2e}" for k, v in self.diffs.items())
        verdict = "<=" if self.same else "EXCEEDS"
        return (f"{self.op} {self.pass_} {self.peer} vs {MASKBENCH} at {self.size}: relative Frobenius difference "
                f"{parts}; max {self.max_rel_diff:.2e} {verdict} tolerance {self.tolerance:.2e}")


def compare(op: str, pass_: str, problem: Problem) -> Equivalence:
    """Run maskbench and the op's peer on ``problem`` (untimed) and measure how far apart they are."""
    peer = PEER_OF[op]
    want = pass_ == "forward+backward"
    mine = results(prepare(op, MASKBENCH, problem, want), pass_)
    theirs = results(prepare(op, peer, problem, want), pass_)
    diffs = {name: relative_difference(theirs[name], mine[name]) for name in mine}
    return Equivalence(op, pass_, peer, problem.size, diffs, tolerance(problem.size, pass_, problem.q.dtype))
