"""TreeDCMask: M_ij = f(dist(i, j)) for any f on an unweighted forest in O(N log^2 N c)
(choromanski22 Lemma 6.1, Eq. 26; docs/papers.md Sec. 2): the torch product of a SeparatorPlan."""
from __future__ import annotations

import numpy as np
import torch

import fast.segments as segments
from fast.masks.tree.forest import (DEFAULT_MAX_CHUNK_BYTES, DistanceFunctionMask, Forest, FTable, check_f,
                                   check_unweighted)
from fast.masks.tree.separator_plan import DEFAULT_DENSE_THRESHOLD, DENSE_ROW, SeparatorPlan
from fast.segments import IndexAdd, Segments
from fast.validation import check_positive_int, check_tokens, compute_dtype

#: The dtype of every scatter (index_add_), Hankel product and FFT of a TreeDCMask product,
#: whatever the input dtype (docs/papers.md, fast.masks.tree: "Precision of the tree products").
ACCUMULATE_DTYPE = torch.float64
#: Step plans (the scatters and gathers of one product step, fast.segments) kept per device off
#: CPU: those of the last few step layouts (a layout is set by the leading size times the columns
#: and the dtype's size, through max_chunk_bytes).
_LAYOUTS_KEPT = 4


class TreeDCMask(DistanceFunctionMask):
    """M_ij = f(dist(i, j)) on an unweighted forest, 0 across trees; O(n log^2 n c) (Lemma 6.1, Eq. 26:
    split at a centroid v, recurse on both sides, add the cross terms through v as Hankel products
    z[a] = sum_b f(a + b) y[b], by FFT or, for short rows, a GEMM).

    forest: an unweighted ``Forest`` (ValueError otherwise); f: (n,) f(0), ..., f(n - 1), finite,
    any sign, may require grad (``check_f``). ``matmul`` (= ``rmatmul``) and ``abs_matmul`` (with |f|)
    take x (..., n, c). dense_threshold (default 64) and max_chunk_bytes (one step's buffers,
    default 32 MiB): positive ints (ValueError naming them). plan: another mask's ``plan`` of this
    forest, shared (it does not depend on f, the device or the dtype); TypeError for another type,
    ValueError for another forest or dense_threshold. The plan costs O(n log n) set-up and memory,
    recursion depth <= log_{3/2} n. Scatters and FFTs run in float64 (``ACCUMULATE_DTYPE``),
    deterministic on CUDA. Derivation, memory and precision: docs/papers.md, fast.masks.tree.

    >>> import torch
    >>> from fast import Forest, TreeDCMask
    >>> path = Forest.from_parent([-1] + list(range(15)))                   # a path of 16 nodes
    >>> g = torch.Generator().manual_seed(0)
    >>> f = torch.randn(16, generator=g, dtype=torch.float64)
    >>> i = torch.arange(16)
    >>> x = torch.rand(16, 2, generator=g, dtype=torch.float64)
    >>> op = TreeDCMask(path, f, dense_threshold=2)
    >>> torch.allclose(op.matmul(x), f[(i[:, None] - i[None]).abs()] @ x), op.recursion_depth
    (True, 4)
    """

    def __init__(self, forest: Forest, f: FTable, *, dense_threshold: int | None = None,
                 max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES, plan: SeparatorPlan | None = None):
        check_unweighted(forest, "TreeDCMask")
        if dense_threshold is not None:
            dense_threshold = check_positive_int("dense_threshold", dense_threshold)
        self.forest = forest
        self.n = forest.n
        self.f = check_f(f, self.n)
        self.max_chunk_bytes = check_positive_int("max_chunk_bytes", max_chunk_bytes)
        if plan is None:
            plan = SeparatorPlan.build(forest, DEFAULT_DENSE_THRESHOLD if dense_threshold is None else dense_threshold)
        elif not isinstance(plan, SeparatorPlan):
            raise TypeError(f"plan must be a SeparatorPlan (another TreeDCMask's .plan), got {type(plan).__name__}")
        elif plan.forest is not forest:
            raise ValueError("plan was built for another Forest; pass the forest it was built from (plan.forest)")
        elif dense_threshold is not None and dense_threshold != plan.dense_threshold:
            raise ValueError(f"dense_threshold={dense_threshold} disagrees with the plan's "
                             f"dense_threshold={plan.dense_threshold}; leave it out to use the plan's")
        self.plan = plan
        self.dense_threshold = plan.dense_threshold
        self.recursion_depth = plan.recursion_depth
        self.num_subproblems = plan.num_subproblems
        self.num_dense_blocks = plan.num_dense_blocks
        self.num_fft_rows = plan.num_fft_rows
        self._tensors: dict = {}

    def _device_plan(self, device: torch.device | str) -> dict:
        """The plan's index arrays and dense blocks as tensors on ``device`` (cached per device), the
        permutations to and from preorder (fast.segments), and the steps' plans (``_steps``)."""
        key = str(device)
        if key not in self._tensors:
            t = {k: torch.as_tensor(v, device=device) for k, v in self.plan.index_arrays().items()}
            t["blocks"] = [(size, torch.as_tensor(nodes, device=device), torch.as_tensor(dists, device=device))
                           for size, nodes, dists in self.plan.blocks]
            t["to_pre"], t["from_pre"] = IndexAdd(t["pre_node"]), IndexAdd(t["label"])
            t["hankel"] = {}  # per dense-row key: the Segments of a + b (the table's gather with grad)
            t["steps"] = {}  # per step layout: {step bounds: plans} (_steps)
            self._tensors[key] = t
        return self._tensors[key]

    @staticmethod
    def _steps(plan: dict, layout: tuple, device: torch.device) -> dict:
        """The step plans of one layout, cached for the last _LAYOUTS_KEPT layouts where planning costs
        something (CUDA: sorts, host reads). On CPU (index_add_ and index_select themselves) a step's
        plan is a few views and one subtraction, and caching it would only hold memory (~7 MiB per
        layout at N = 2^15, B = 2, beside the plan's 19 MiB): built at every call instead."""
        if segments.backend(device) == "index_add":
            return {}
        steps = plan["steps"].pop(layout, None)
        if steps is None:
            steps = {}
        plan["steps"][layout] = steps  # most recent last
        while len(plan["steps"]) > _LAYOUTS_KEPT:
            plan["steps"].pop(next(iter(plan["steps"])))
        return steps

    # ----------------------------------------------------------------------- product

    def _matmat(self, x: torch.Tensor) -> torch.Tensor:
        """M @ x for x (..., n, c) -> (..., n, c): dense blocks, Hankel FFTs, the f(0) fix at the v's."""
        return self._product(x, self.f)

    def _abs_matmat(self, x: torch.Tensor) -> torch.Tensor:
        """B @ x with B_ij = |f|(dist(i, j)) >= |M_ij| (0 across trees): the same product with |f|
        (fast.operator: the guard's scale of the terms a denominator sums when f has both signs)."""
        return self._product(x, self.f.detach().abs())

    def _product(self, x: torch.Tensor, f_table: torch.Tensor) -> torch.Tensor:
        """M @ x for the table f_table (n,) in place of f."""
        check_tokens("x", x, self.n)
        out_dtype, work = x.dtype, compute_dtype(x.dtype)
        lead, c, n = x.shape[:-2], x.shape[-1], self.n
        plan = self._device_plan(x.device)
        # preorder: every subproblem is a few contiguous ranges, so the gathers below stay local
        xs = plan["to_pre"].take(x.to(work).reshape(-1, n, c), dim=1)  # a gather (fast.segments backward)
        f = f_table.to(device=x.device, dtype=work)
        grad = torch.is_grad_enabled() and (xs.requires_grad or f.requires_grad)
        f_grad = torch.is_grad_enabled() and f.requires_grad
        steps = self._steps(plan, (xs.shape[0] * c, xs.element_size()), x.device)
        out = self._dense_blocks(xs, f, plan, steps, f_grad)
        out = self._cross_terms(xs, f, out, grad, steps, f_grad)[:, :n]  # ACCUMULATE_DTYPE
        out = out - f[0] * plan["splits"].to(out.dtype)[:, None] * xs  # v was in both halves of its split
        return plan["from_pre"].take(out, dim=1).reshape(*lead, n, c).to(out_dtype)

    def _dense_blocks(self, xs: torch.Tensor, f: torch.Tensor, plan: dict, steps: dict, f_grad: bool) -> torch.Tensor:
        """sum over dense blocks of f(dist) @ x[block] (in xs's dtype), scattered back into a
        float64 (B, n + 1, c) (ACCUMULATE_DTYPE: no float32 atomic add).

        The scatters and gathers go through fast.segments (planned once per step, in ``steps``):
        index_add_ and index_select themselves on CPU, no atomic add on CUDA; so does the gather of
        f at the distances when f requires grad (its backward sums by distance)."""
        B, n, c = xs.shape
        xp = torch.cat([xs, xs.new_zeros(B, 1, c)], dim=1)  # row n: padding
        out = xs.new_zeros(B, n + 1, c, dtype=ACCUMULATE_DTYPE)
        f_ext = torch.cat([f, f.new_zeros(1)])  # f_ext[n] = 0: padding and pairs across trees
        item = xs.element_size()
        for which, (size, nodes, dists) in enumerate(plan["blocks"]):
            step = max(1, self.max_chunk_bytes // (size * item * (3 * B * c + size)))
            # distances within a block are < min(size, n); n (padding, across trees) reads the 0 after them
            table = torch.cat([f[:min(size, n)], f.new_zeros(1)]) if f_grad else None
            for b0 in range(0, nodes.shape[0], step):
                key = ("dense", which, b0, b0 + step)
                if key not in steps:
                    steps[key] = {"rows": IndexAdd(nodes[b0:b0 + step].reshape(-1))}
                rows = steps[key]["rows"]
                xb = rows.take(xp, dim=1).view(B, -1, size, c)
                d = dists[b0:b0 + step]
                if f_grad:
                    if "dist" not in steps[key]:
                        steps[key]["dist"] = Segments(d.reshape(-1).to(torch.int64).clamp_(max=min(size, n)),
                                                      min(size, n) + 1)
                    fb = steps[key]["dist"].expand(table, dim=0).view(d.shape)
                else:
                    fb = f_ext[d]  # a gather; no backward
                rows.add_into(out, torch.matmul(fb, xb).view(B, -1, c).to(out.dtype), dim=1)
        return out

    def _cross_terms(self, xs: torch.Tensor, f: torch.Tensor, out: torch.Tensor, grad: bool, steps: dict,
                     f_grad: bool) -> torch.Tensor:
        """Adds the Hankel products through the separators to out (B, n + 1, c) (ACCUMULATE_DTYPE) and
        returns it; xs, f in the compute dtype. Rows are processed in steps of one key that fit
        ``max_chunk_bytes``: y by segment sums of x at distance bins, z = H y (dense rows, a GEMM) or
        z = irfft(rfft(y) conj(rfft(f[:N]))) (FFT rows, z[a] at bin N - a), gathered at the targets' bins
        and added to their rows, every step's gathers and sums through fast.segments plans (``steps``).
        """
        B, n, c = xs.shape
        p = self.plan
        plan = self._device_plan(xs.device)
        budget = max(1, self.max_chunk_bytes // (6 * B * c * out.element_size()))
        ops: dict = {}  # per key: the Hankel matrix, or conj(rfft(f[:N])) as (N // 2 + 1, 1)
        rows, r0, change = len(p.row_key), 0, p.key_change
        while r0 < rows:
            kind, z_len, y_len = key = p.row_key[r0]
            r1 = int(np.searchsorted(p.w_start, p.w_start[r0] + budget, side="right")) - 1
            nxt = change[np.searchsorted(change, r0, side="right"):]
            r1 = min(max(r1, r0 + 1), int(nxt[0]) if nxt.size else rows)
            y0, z0 = int(p.y_start[r0]), int(p.z_start[r0])
            s0, s1 = int(p.src_off[r0]), int(p.src_off[r1])
            t0, t1 = int(p.tgt_off[r0]), int(p.tgt_off[r1])
            step = steps.get(("cross", r0, r1))
            if step is None:  # the step's sources by node and y bin, targets by z bin and node
                step = steps[("cross", r0, r1)] = (
                    IndexAdd(plan["src_node"][s0:s1]), Segments(plan["src_bin"][s0:s1] - y0, (r1 - r0) * y_len),
                    Segments(plan["tgt_bin"][t0:t1] - z0, (r1 - r0) * z_len), IndexAdd(plan["tgt_node"][t0:t1]))
            src_node, src_bin, tgt_bin, tgt_node = step
            y = src_bin.sum(src_node.take(xs, dim=1).to(out.dtype), dim=1)  # (B, rows * y length, c)
            y = y.view(B, r1 - r0, y_len, c)
            if key not in ops:
                if kind == DENSE_ROW:
                    a = torch.arange(1, z_len + 1, device=xs.device)
                    b = torch.arange(1, y_len + 1, device=xs.device)
                    fp = torch.nn.functional.pad(f, (0, max(0, z_len + y_len + 1 - n)))
                    if f_grad:  # H[a - 1, b - 1] = f(a + b), a gather whose backward sums by a + b (fast.segments)
                        if key not in plan["hankel"]:
                            plan["hankel"][key] = Segments((a[:, None] + b[None, :]).reshape(-1), z_len + y_len + 1,
                                                           longest=min(z_len, y_len))
                        ops[key] = plan["hankel"][key].expand(fp[:z_len + y_len + 1], dim=0).view(z_len, y_len)
                    else:
                        ops[key] = fp[a[:, None] + b[None, :]]  # H[a - 1, b - 1] = f(a + b)
                else:
                    spec = torch.fft.rfft(torch.nn.functional.pad(f[:z_len].to(out.dtype), (0, max(0, z_len - n))))
                    ops[key] = spec.conj().resolve_conj()[:, None]
            if kind == DENSE_ROW:  # a short GEMM: the compute dtype keeps it fast; the casts keep subnormals
                z = torch.matmul(ops[key], y.to(xs.dtype)).to(out.dtype)
            else:
                spec = torch.fft.rfft(y, dim=2)
                spec = spec * ops[key] if grad else spec.mul_(ops[key])
                z = torch.fft.irfft(spec, n=z_len, dim=2)
            z = z.reshape(B, (r1 - r0) * z_len, c).contiguous()
            tgt_node.add_into(out, tgt_bin.expand(z, dim=1), dim=1)
            r0 = r1
        return out
