"""equivalence/<mechanism>: fast equals reference on identical draws, float64 and float32, on
every variant of the mechanism.

The statistic is the worst NORMALISED error: the max over variants, N and (batch, head) slices of
float64 error / TOL["float64"], float32 error / TOL["float32"] and, for learnable variants, the
gradient error / GRAD_TOL (threshold 1, unit "ratio"), so statistic <= 1 exactly when every error
is within its tolerance. The raw errors stay in the details (float64_max_rel_error,
float32_max_rel_error, grad_max_rel_error) with the component and slice that set the statistic
(worst_component, worst_variant, worst_slice). The update protocol adds reasons of its own (below):
"the update moved nothing" can fail a check whose statistic is <= 1 (the protocol tested nothing,
whatever the errors); "stale cache" explains an updated call's error, which the statistic already
counts.

Problems have batch and head dims (registry.EQUIVALENCE_BATCH = (2, 2)) whose slices differ by
orders of magnitude (verify.favor.batch_magnitudes: values 1e-3 .. 1e3, one slice of quiet keys
~128 below the others in FAVOR+ exponent), and every (batch, head) slice is compared with the
reference ON ITS OWN: the error of a variant is the worst slice's relative Frobenius error
|fast_s - ref_s|_F / |ref_s|_F, so a small slice spoiled by a big one (a stabiliser or a causal
state shared across the batch) cannot hide behind the big one's norm. The details name the slice.

A variant's protocol (registry.PROTOCOLS) says how it runs:

- plain: build the operator, call once, compare.
- update: the mechanism's mask_params are float64 tensors the operator holds (no copy). Call,
  multiply every parameter entry by exp(0.3 xi) (xi ~ N(0, 1) from rng_for(seed, UPDATE_SALT),
  a positive factor, so signs, zeros and -inf logits stay valid), write the new values IN PLACE
  under no_grad (an optimiser step), call the SAME runner again and compare with the reference of
  the updated problem. A cached derived quantity (an FFT spectrum) must follow the update. The
  update must move the reference by >= UPDATE_MIN_MOVE in every slice at the largest N, else the
  protocol tests nothing and the check fails saying so (a reason beside the statistic).
- learnable: the mask_params are float64 leaves requiring grad (the float32 run keeps them float64
  and lets the operator cast). Forward compared as for plain, both dtypes; in float64, per slice s,
  the directional derivative of L_s = <G_s, out_s> along a random relative direction D of the
  parameters (D = xi |p|: zeros and non-finite entries stay put), autograd's sum_p <dL_s/dp, D_p>
  against the central difference of the float64 reference, (L_s(p + hD) - L_s(p - hD)) / 2h,
  with G_s of unit Frobenius norm. The error is normalised by |ref_s|_F (Cauchy-Schwarz: |<G_s, e>|
  <= |e|_F) and must be <= GRAD_TOL (see there for the bound). If the float64 forward raised
  (DenominatorError) at every N, no gradient was checked: the check fails saying so. Parameters
  that autograd does not reach (an output that does not require grad, or a None gradient in every
  slice) count as a zero gradient, which is right where the output does not depend on them (a
  1-node hypercube); they are listed per N (grad_unreached), and a failing gradient names them
  (the fast path dropped or detached them: the error is then |fd| / |ref_s|, the whole derivative).
- backward: q, k and v are float64 leaves requiring grad (the float32 run casts them). Forward
  compared as for plain, both dtypes; in float64, per slice, the directional derivative of
  L_s = <G_s, out_s> along a random relative direction D of q, k and v (D = xi |x|, divided by 16
  for q and k: BACKWARD_INPUTS), autograd (the fast path's backward: the transposed products
  M^T x of Algorithm 1's gradient, the features' and stabilisers' chain rule) against the central
  difference of the float64 reference (step FD_STEP), normalised by |ref_s|_F and held to GRAD_TOL
  as above. A linear
  record's operator (``fast_mask``) is also applied to a random x (N, 3) in both dtypes: matmul
  against the dense mask M (``dense_mask``) and, where it offers one, rmatmul against M^T, each
  a relative Frobenius error under the dtype's tolerance (keys ".../matmul", ".../rmatmul"): a
  user calls them directly, and the backward reaches rmatmul only through the attention's
  gradient.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import numpy as np
import torch

from fast.errors import DenominatorError
from measure.timing import pinned_threads
from results.check import Check, Context, Outcome, judged
from verify.mechanisms import mechanisms
from verify.problems import Problem, rng_for
from verify.registry import EQUIVALENCE_BATCH, Mechanism, Variant

#: Relative Frobenius error bounds (issue 2): float64 near round-off, float32 a few ulps * growth.
TOL = {"float64": 1e-10, "float32": 1e-4}
#: Sizes: one below the causal chunk, a non-multiple of it, and a larger one.
QUICK_SIZES = (1, 37, 300)
FULL_SIZES = (1, 2, 37, 64, 300, 1000)
DTYPES = (("float64", torch.float64), ("float32", torch.float32))
#: "update": every parameter entry is multiplied by exp(UPDATE_NOISE * xi), xi ~ N(0, 1).
UPDATE_NOISE = 0.3
#: "update": the reference must move by at least this (relative, every slice, largest N).
UPDATE_MIN_MOVE = 1e-3
#: "learnable": central-difference step along the relative direction D = xi |p|.
FD_STEP = 1e-5
#: "learnable": bound on |autograd - central difference| / |ref_s|_F. For a positive mask linear
#: in its parameters (Toeplitz tables, a tree's f) each output row along p + tD is a ratio
#: (a + t b) / (c + t e) with |e / c| <= r = max |xi| (~4 over a few hundred draws), whose k-th
#: derivative is <= k! r^k times the row's scale: the central difference's truncation error is
#: <= h^2 / 6 * 6 r^3 |out| ~ 6e-9 |out| at h = 1e-5, and the reference's float64 round-off
#: (~1e-14 relative, equivalence's own float64 errors) over h adds ~1e-9. 1e-6 leaves a factor
#: > 100 over both (nonlinear parameters, a diffusion time or RPE encodings, measured <= 3e-11);
#: a gradient that misses the parameters (a detached spectrum) is off by |J D| / |out| ~ 1e-2.
GRAD_TOL = 1e-6
#: "backward": the leaves (Problem fields) that require grad, and the factor their relative direction
#: D = xi |x| is divided by. v enters linearly (the central difference is exact up to round-off); q
#: and k enter through FAVOR+ exponents whose spread within a slice moves by up to ~64 per unit step
#: along xi |k| (keys of norm 32 in the quiet slice, |x|^2 / 2 ~ 256 at d = 16 over sqrt(d) entries,
#: max |xi| ~ 4): shrunk 16 times, ~4, so the central difference's truncation at FD_STEP is
#: h^2 / 6 * 4^3 |out| ~ 1e-9 |out| (unshrunk, ~4e-6, over GRAD_TOL), beside float64 round-off of
#: the reference over 2h, ~1e-9. GRAD_TOL leaves > 100x over both; measured <= 1e-10. A backward
#: that drops or transposes wrongly a term of q's or k's gradient is still off by ~|J D| / |out|
#: >= 1e-3 (1/16 of the unshrunk derivative).
BACKWARD_INPUTS = {"q": 16.0, "k": 16.0, "v": 1.0}
#: "backward": columns of the random x the operator's matmul and rmatmul are applied to.
OPERATOR_COLUMNS = 3
#: torch intra-op threads while equivalence runs (restored after); correctness does not depend on it.
EQUIVALENCE_THREADS = 1
#: Salts of rng_for(seed, salt, N) for the update factors, the gradient's G and direction D (used
#: by no other module: guards has 90, reproducibility 91).
UPDATE_SALT, GRAD_SALT, BACKWARD_SALT = 96, 97, 98
#: The statistic's threshold: every error over its tolerance is <= 1.
THRESHOLD = 1.0


# ------------------------------------------------------------------------------ per-slice errors


def slice_errors(expected: np.ndarray, got) -> np.ndarray:
    """Relative Frobenius error |got_s - exp_s|_F / |exp_s|_F of every (batch, head) slice s.

    expected, got: (*batch, N, d) (got may be a Tensor) -> (prod(batch),) float64; unbatched
    inputs (N, d) are one slice. A NaN anywhere in a slice makes its error NaN (never a pass).
    """
    if isinstance(got, torch.Tensor):
        got = got.detach().cpu().double().numpy()
    g = np.asarray(got, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if g.shape != e.shape:
        raise ValueError(f"shape mismatch: reference {e.shape} vs fast {g.shape}")
    e = e.reshape(-1, *e.shape[-2:])
    g = g.reshape(-1, *g.shape[-2:])
    num = np.linalg.norm((g - e).reshape(len(e), -1), axis=1)
    den = np.maximum(np.linalg.norm(e.reshape(len(e), -1), axis=1), np.finfo(float).tiny)
    return num / den


def slice_label(index: int, batch: tuple[int, ...] = EQUIVALENCE_BATCH) -> str:
    """'(b=1, h=0)' for flat slice ``index`` of leading dims ``batch`` (names b, h, then dims 2, 3...)."""
    if not batch:
        return "(unbatched)"
    names = ["b", "h"] + [f"dim{i}" for i in range(2, len(batch))]
    pos = np.unravel_index(int(index), batch)
    return "(" + ", ".join(f"{n}={int(p)}" for n, p in zip(names, pos)) + ")"


class _Record:
    """Per-variant bookkeeping: {key: worst-slice error} and the worst slice of every key."""

    def __init__(self):
        self.errors: dict[str, float] = {}
        self.slices: dict[str, str] = {}

    def add(self, key: str, expected: np.ndarray, got) -> np.ndarray:
        errs = slice_errors(expected, got)
        worst = int(np.argmax(np.where(np.isnan(errs), np.inf, errs)))
        self.errors[key] = float(errs[worst])
        self.slices[key] = slice_label(worst, tuple(np.shape(expected)[:-2]))
        return errs

    @contextmanager
    def guarded(self, key: str):
        """Run a fast call; a DenominatorError (the fast path refusing the problem: a vanished
        denominator, e.g. features underflowing) is recorded as an infinite error of ``key``."""
        try:
            yield
        except DenominatorError as exc:
            self.errors[key] = float("inf")
            self.slices[key] = f"(raised {type(exc).__name__}: {exc})"

    def worst(self, dtype_name: str) -> tuple[float, str]:
        """(worst error, 'key slice') over the keys of one dtype."""
        keys = [k for k in self.errors if k.startswith(dtype_name + "/")]
        key = max(keys, key=lambda k: _nan_high(self.errors[k]))
        return self.errors[key], f"{key} {self.slices[key]}"


def _nan_high(x: float) -> float:
    return np.inf if np.isnan(x) else x


def _call(mech: Mechanism, runner, dtype: torch.dtype) -> torch.Tensor:
    """runner(), checking the output dtype."""
    got = runner()
    if got.dtype != dtype:
        raise TypeError(f"{mech.id}: fast returned {got.dtype} for {dtype} inputs")
    return got


# ------------------------------------------------------------------------------ protocols


def _with(problem: Problem, values: dict) -> Problem:
    """The problem with some extras replaced (the rest shared)."""
    return replace(problem, extras={**problem.extras, **values})


def _params(mech: Mechanism, problem: Problem) -> dict[str, np.ndarray]:
    return {name: np.asarray(problem.extras[name], dtype=np.float64) for name in mech.mask_params}


def _param_tensors(params: dict[str, np.ndarray], device, requires_grad: bool) -> dict[str, torch.Tensor]:
    """float64 tensors (copies: the in-place update must not write into the problem's arrays)."""
    return {name: torch.tensor(value, dtype=torch.float64, device=device).requires_grad_(requires_grad)
            for name, value in params.items()}


def _plain(mech, problem, expected, n, ctx, rec: _Record, info: dict) -> None:
    for name, dtype in DTYPES:
        with rec.guarded(f"{name}/N={n}"):
            rec.add(f"{name}/N={n}", expected, _call(mech, mech.fast_setup(problem, ctx.device, dtype), dtype))


def _update(mech, problem, expected, n, ctx, rec: _Record, info: dict) -> None:
    """Call, change the mask parameters in place, call the same runner again (module docstring)."""
    params = _params(mech, problem)
    rng = rng_for(ctx.seed, UPDATE_SALT, n)
    new = {name: np.where(np.isfinite(p), p * np.exp(UPDATE_NOISE * rng.standard_normal(p.shape)), p)
           for name, p in params.items()}
    expected_new = mech.reference(_with(problem, new))
    info.setdefault("update_move", {})[f"N={n}"] = float(np.min(slice_errors(expected, expected_new)))
    for name, dtype in DTYPES:
        tensors = _param_tensors(params, ctx.device, requires_grad=False)
        runner = mech.fast_setup(_with(problem, tensors), ctx.device, dtype)
        with rec.guarded(f"{name}/N={n}"):
            rec.add(f"{name}/N={n}", expected, _call(mech, runner, dtype))
        with torch.no_grad():
            for key, t in tensors.items():
                t.copy_(torch.as_tensor(new[key], dtype=torch.float64, device=t.device))
        with rec.guarded(f"{name}/N={n}/updated"):
            got_new = _call(mech, runner, dtype)
            rec.add(f"{name}/N={n}/updated", expected_new, got_new)
            # a stale result matches the OLD reference: say so, it names the bug (a cache, a copy)
            stale = float(np.max(slice_errors(expected, got_new)))
            info.setdefault("updated_vs_old_reference", {})[f"{name}/N={n}"] = stale


def _learnable(mech, problem, expected, n, ctx, rec: _Record, info: dict) -> None:
    """Forward with leaves requiring grad (both dtypes); float64 gradient vs central differences."""
    params = _params(mech, problem)
    for name, dtype in DTYPES:
        leaves = _param_tensors(params, ctx.device, requires_grad=True)
        got = None
        with rec.guarded(f"{name}/N={n}"):
            got = _call(mech, mech.fast_setup(_with(problem, leaves), ctx.device, dtype), dtype)
            rec.add(f"{name}/N={n}", expected, got)
        if dtype == torch.float64 and got is not None:
            try:
                errs, unreached = _gradient_errors(mech, problem, params, leaves, got, expected, n, ctx)
                info.setdefault("grad_unreached", {})[f"N={n}"] = unreached
            except RuntimeError as exc:  # autograd refused (a graph cut from the parameters): a finding
                info.setdefault("grad_failure", {})[f"N={n}"] = f"{type(exc).__name__}: {exc}"
                errs = np.array([np.inf])
            info.setdefault("grad_rel_error", {})[f"N={n}"] = float(np.max(errs))
            info.setdefault("grad_worst_slice", {})[f"N={n}"] = slice_label(int(np.argmax(errs)), tuple(got.shape[:-2]))


def _gradient_errors(mech, problem, params, leaves, got, expected, n, ctx) -> tuple[np.ndarray, list[str]]:
    """(per slice: |autograd - central difference| / |ref_s|_F of d<G_s, out_s> along D (see GRAD_TOL),
    the names of the parameters autograd reached in no slice: all of them when the output does
    not require grad). An unreached parameter contributes 0 to autograd's side."""
    rng = rng_for(ctx.seed, GRAD_SALT, n)
    lead = got.shape[:-2]
    slices = int(np.prod(lead)) if lead else 1
    g = rng.standard_normal((slices, *got.shape[-2:]))
    g /= np.linalg.norm(g.reshape(slices, -1), axis=1).reshape(-1, 1, 1)
    direction = {k: np.where(np.isfinite(p), rng.standard_normal(p.shape) * np.abs(p), 0.0) for k, p in params.items()}
    # central difference of the float64 reference, per slice
    plus = mech.reference(_with(problem, {k: p + FD_STEP * direction[k] for k, p in params.items()}))
    minus = mech.reference(_with(problem, {k: p - FD_STEP * direction[k] for k, p in params.items()}))
    diff = (plus - minus).reshape(slices, *got.shape[-2:]) / (2 * FD_STEP)
    fd = (diff * g).sum(axis=(1, 2))
    return _directional_errors(got, g, leaves, direction, fd, expected, slices)


def _backward(mech, problem, expected, n, ctx, rec: _Record, info: dict) -> None:
    """Forward with q, k, v leaves requiring grad (both dtypes); float64 gradient vs the reference's
    four-point central difference; a linear record's operator against the dense mask (module doc)."""
    base = {f: np.asarray(getattr(problem, f), dtype=np.float64) for f in BACKWARD_INPUTS}
    for name, dtype in DTYPES:
        leaves = {f: torch.tensor(a, dtype=torch.float64, device=ctx.device).requires_grad_(True)
                  for f, a in base.items()}
        got = None
        with rec.guarded(f"{name}/N={n}"):
            got = _call(mech, mech.fast_setup(replace(problem, **leaves), ctx.device, dtype), dtype)
            rec.add(f"{name}/N={n}", expected, got)
        if dtype == torch.float64 and got is not None:
            try:
                errs, unreached = _input_gradient_errors(mech, problem, base, leaves, got, expected, n, ctx)
                info.setdefault("grad_unreached", {})[f"N={n}"] = unreached
            except RuntimeError as exc:  # autograd refused: a finding
                info.setdefault("grad_failure", {})[f"N={n}"] = f"{type(exc).__name__}: {exc}"
                errs = np.array([np.inf])
            info.setdefault("grad_rel_error", {})[f"N={n}"] = float(np.max(errs))
            info.setdefault("grad_worst_slice", {})[f"N={n}"] = slice_label(int(np.argmax(errs)), tuple(got.shape[:-2]))
        _operator_products(mech, problem, n, ctx, name, dtype, rec)


def operator_and_dense(mech: Mechanism, problem: Problem, device) -> tuple[object, np.ndarray] | None:
    """A linear record's fast operator on ``device`` and its dense float64 mask, or None where the
    record has no operator to compare (not linear, no fast_mask or dense_mask, or fast_mask None)."""
    if not (mech.linear and mech.fast_mask is not None and mech.dense_mask is not None):
        return None
    op = mech.fast_mask(problem, device)
    if op is None:
        return None
    return op, np.asarray(mech.dense_mask(problem), dtype=np.float64)


def _operator_products(mech, problem, n, ctx, name, dtype, rec: _Record) -> None:
    """A linear record's operator on a random x (N, OPERATOR_COLUMNS): matmul vs M x, rmatmul vs M^T x."""
    pair = operator_and_dense(mech, problem, ctx.device)
    if pair is None:
        return
    op, dense = pair
    x = rng_for(ctx.seed, BACKWARD_SALT, n, 1).standard_normal((n, OPERATOR_COLUMNS))
    xt = torch.as_tensor(x, dtype=dtype, device=ctx.device)
    products = [("matmul", op.matmul, dense)]
    if getattr(op, "has_rmatmul", False):
        products.append(("rmatmul", op.rmatmul, dense.T))
    for what, apply, m in products:
        with rec.guarded(f"{name}/N={n}/{what}"), torch.no_grad():
            rec.add(f"{name}/N={n}/{what}", m @ x, apply(xt))


def _input_gradient_errors(mech, problem, base, leaves, got, expected, n, ctx) -> tuple[np.ndarray, list[str]]:
    """(per slice: |autograd - central difference| / |ref_s|_F of d<G_s, out_s> along D = xi |x| /
    shrink over q, k, v (BACKWARD_INPUTS), the inputs autograd reached in no slice)."""
    rng = rng_for(ctx.seed, BACKWARD_SALT, n)
    lead = got.shape[:-2]
    slices = int(np.prod(lead)) if lead else 1
    g = rng.standard_normal((slices, *got.shape[-2:]))
    g /= np.linalg.norm(g.reshape(slices, -1), axis=1).reshape(-1, 1, 1)
    direction = {f: rng.standard_normal(a.shape) * np.abs(a) / BACKWARD_INPUTS[f] for f, a in base.items()}

    def loss(t: float) -> np.ndarray:
        out = mech.reference(replace(problem, **{f: a + t * direction[f] for f, a in base.items()}))
        return (np.asarray(out).reshape(slices, *got.shape[-2:]) * g).sum(axis=(1, 2))

    fd = (loss(FD_STEP) - loss(-FD_STEP)) / (2 * FD_STEP)
    return _directional_errors(got, g, leaves, direction, fd, expected, slices)



def _directional_errors(got, g, leaves: dict, direction: dict, fd, expected, slices: int):
    """Per slice s, |<d/dleaves sum(got_s * g_s), direction> - fd_s| / |expected_s| (autograd one slice
    at a time, retain_graph: the same forward serves every slice), and the leaves no graph reached
    (a zero gradient, named by the caller)."""
    out = got.reshape(slices, *got.shape[-2:])
    gt = torch.as_tensor(g, dtype=got.dtype, device=got.device)
    auto = np.zeros(slices)
    names = list(leaves)
    reached = set()
    for s in range(slices):
        if not out.requires_grad:  # no graph reaches the leaves
            break
        grads = torch.autograd.grad((out[s] * gt[s]).sum(), [leaves[k] for k in names], retain_graph=True,
                                    allow_unused=True)
        reached.update(k for k, gr in zip(names, grads) if gr is not None)
        auto[s] = sum(float((gr.detach().cpu().double().numpy() * direction[k]).sum())
                      for k, gr in zip(names, grads) if gr is not None)
    scale = np.maximum(np.linalg.norm(np.asarray(expected).reshape(slices, -1), axis=1), np.finfo(float).tiny)
    return np.abs(auto - fd) / scale, [k for k in names if k not in reached]

PROTOCOL_RUNS = {"plain": _plain, "update": _update, "learnable": _learnable, "backward": _backward}


# ------------------------------------------------------------------------------ the check


def _variant(mech: Mechanism, variant: Variant, sizes, ctx: Context) -> tuple[dict, list[str]]:
    """(details, reasons) of one variant. details["normalised_error"] is the variant's share of the
    statistic: the largest of its float64 / float32 (and, learnable, gradient) errors over their
    tolerances, named by details["worst_component"] and located by details["worst"]."""
    rec, info = _Record(), {}
    ns = sorted({mech.admissible(n) for n in sizes})
    for n in ns:
        problem = mech.problem(n, ctx.seed, variant, batch=EQUIVALENCE_BATCH)
        expected = mech.reference(problem)
        PROTOCOL_RUNS[variant.protocol](mech, problem, expected, n, ctx, rec, info)
    details = {"protocol": variant.protocol}
    reasons = []
    normalised: dict[str, tuple[float, str]] = {}  # component -> (error / tolerance, where)
    for name in TOL:
        err, where = rec.worst(name)
        details[f"{name}_max_rel_error"] = err
        details[f"{name}_worst"] = where
        normalised[name] = (err / TOL[name], where)
        if not err <= TOL[name]:
            reasons.append(f"variant {variant.name!r}: {name} relative error {err:.3g} > {TOL[name]:g} "
                           f"at {where}")
    details["errors"] = rec.errors
    details["worst_slices"] = rec.slices
    details.update(info)
    if variant.protocol == "update":
        move = info["update_move"][f"N={ns[-1]}"]
        if not move >= UPDATE_MIN_MOVE:
            reasons.append(f"variant {variant.name!r}: the in-place update moved the reference by only "
                           f"{move:.3g} < {UPDATE_MIN_MOVE:g} at N={ns[-1]}: the protocol tests nothing")
        # absent where the updated call raised (its error is already infinite)
        stale = [k for k, v in info.get("updated_vs_old_reference", {}).items()
                 if v <= TOL[k.split("/")[0]] and not rec.errors[k + "/updated"] <= TOL[k.split("/")[0]]]
        if stale:
            reasons.append(f"variant {variant.name!r}: after the in-place update the output still equals the "
                           f"old parameters' reference ({', '.join(stale)}): a stale cache or a copied parameter")
    if variant.protocol in ("learnable", "backward"):
        of = "the mask parameters" if variant.protocol == "learnable" else "q, k and v"
        grads = info.get("grad_rel_error", {})
        if not grads:  # every float64 forward raised: nothing to differentiate
            grad, where = float("inf"), "(not checked)"
            reasons.append(f"variant {variant.name!r}: gradient not checked: the float64 forward raised at "
                           f"every N ({', '.join(f'N={n}' for n in ns)})")
        else:
            at = max(grads, key=lambda k: _nan_high(grads[k]))
            grad, where = grads[at], f"{at} {info['grad_worst_slice'][at]}"
            if not grad <= GRAD_TOL:
                failure = info.get("grad_failure", {}).get(at)
                unreached = info.get("grad_unreached", {}).get(at)
                reasons.append(f"variant {variant.name!r}: float64 gradient of {of} "
                               + (f"failed at {at}: {failure}" if failure else
                                  f"off by {grad:.3g} > {GRAD_TOL:g} (autograd vs central differences of the "
                                  f"reference) at {where}")
                               + (f"; autograd reached no gradient of {', '.join(unreached)} (the fast output has "
                                  f"no graph to them: the fast path dropped or detached them)" if unreached else ""))
        details["grad_max_rel_error"] = grad
        details["grad_worst"] = where
        normalised["gradient"] = (grad / GRAD_TOL, where)
    component = max(normalised, key=lambda c: _nan_high(normalised[c][0]))
    details["normalised_errors"] = {c: v for c, (v, _) in normalised.items()}
    details["normalised_error"], details["worst"] = normalised[component]
    details["worst_component"] = component
    return details, reasons


def _run(mech: Mechanism, ctx: Context) -> Outcome:
    sizes = QUICK_SIZES if ctx.quick else FULL_SIZES
    per_variant, reasons = {}, []
    # one intra-op thread: these problems are small (N <= 1000), and the tree recursions' many small
    # ops ran 7-9x slower on 2 threads than on 1 on a busy 2-core machine (tree-diam's path, 300 levels)
    with pinned_threads(EQUIVALENCE_THREADS):
        for variant in mech.all_variants:
            ctx.note(f"equivalence/{mech.id} {variant.name}")
            per_variant[variant.name], why = _variant(mech, variant, sizes, ctx)
            reasons += why
    worst = {name: max((v[f"{name}_max_rel_error"] for v in per_variant.values()), key=_nan_high) for name in TOL}
    worst_variant = max(per_variant, key=lambda v: _nan_high(per_variant[v]["normalised_error"]))
    top = per_variant[worst_variant]
    default = per_variant[mech.default_variant.name]
    grads = {k: v["grad_max_rel_error"] for k, v in per_variant.items() if "grad_max_rel_error" in v}
    return judged(not reasons, top["normalised_error"], reasons,
                  float64_max_rel_error=worst["float64"], float32_max_rel_error=worst["float32"],
                  float64_threshold=TOL["float64"], float32_threshold=TOL["float32"],
                  grad_max_rel_error=grads, grad_threshold=GRAD_TOL,
                  worst_variant=worst_variant, worst_component=top["worst_component"], worst_slice=top["worst"],
                  errors=default["errors"], variants=per_variant, batch=list(EQUIVALENCE_BATCH),
                  device=ctx.device, metric="relative Frobenius error per (batch, head) slice, over its tolerance",
                  statistic=f"max over variants, N and (batch, head) slices of float64 relative error / "
                            f"{TOL['float64']:g}, float32 relative error / {TOL['float32']:g} and learnable "
                            f"gradient error / {GRAD_TOL:g} (<= 1 iff all are within tolerance)")


def check_for(mech: Mechanism) -> Check:
    """equivalence/<id> of one record (registered or not)."""
    return Check(f"equivalence/{mech.id}", f"fast == reference: {mech.title}", mech.source, "equivalence",
                 run=lambda ctx: _run(mech, ctx), threshold=THRESHOLD, compare="<=", unit="ratio")


def checks() -> list[Check]:
    return [check_for(m) for m in mechanisms()]
