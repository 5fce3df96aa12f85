"""Helpers shared by test_positional.py and test_tree.py: a torch call counter and the protocol
cases (per slice, held parameters, update, learnable), which run verify.checks.equivalence's own
protocols rather than keep a copy of them."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from results.check import Context
from verify.checks import equivalence
from verify.registry import EQUIVALENCE_BATCH


class CallCounter(TorchFunctionMode):
    """Counts torch calls by function name (torch.fft.rfftn -> "fft_rfftn", Tensor.index_add_ ...)."""

    def __init__(self):
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def variant_reasons(mech, variant, n: int, seed: int) -> tuple[dict, list[str]]:
    """equivalence/<id>'s run of one variant (its protocol: plain, update or learnable) at one N,
    batch (2, 2), per slice: (details, failure reasons)."""
    return equivalence._variant(mech, variant, (n,), Context(quick=True, seed=seed))


def _variant_passes(mech, variant, n: int, seed: int) -> None:
    """variant_reasons with no failure reasons, under the variant's own protocol."""
    details, reasons = variant_reasons(mech, variant, n, seed)
    assert not reasons, reasons
    assert details["protocol"] == variant.protocol


def protocol_per_slice_case(mech, variant, n: int) -> None:
    """Fast (float64 and float32) vs reference per (batch, head) slice on a batch = (2, 2) problem."""
    p = mech.problem(n, 5, variant, batch=EQUIVALENCE_BATCH)
    assert p.q.shape == (*EQUIVALENCE_BATCH, n, 16) and p.v.shape == (*EQUIVALENCE_BATCH, n, 16)
    _variant_passes(mech, variant, n, seed=5)


def protocol_with_tensors(mech, p, requires_grad: bool = False):
    """(the problem with its mask_params as float64 tensors, those tensors): fresh copies, so an
    in-place update never writes into the problem's arrays."""
    tensors = {k: torch.tensor(np.asarray(p.extras[k], dtype=np.float64)).requires_grad_(requires_grad)
               for k in mech.mask_params}
    return replace(p, extras={**p.extras, **tensors}), tensors


def protocol_held_case(mech, n: int, derived: bool = False) -> None:
    """fast_mask holds the mask parameters it is given (the tensors themselves, unless the
    operator derives its factors from them: ``derived``), and gradients reach them."""
    p, leaves = protocol_with_tensors(mech, mech.problem(n, 0), requires_grad=True)
    op = mech.fast_mask(p, "cpu")
    if not derived:
        held = list(op.parameters())
        assert all(any(t is leaf for t in held) for leaf in leaves.values())
    x = torch.rand(n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    (op.matmul(x) * x).sum().backward()
    for name, leaf in leaves.items():
        assert leaf.grad is not None and float(leaf.grad.abs().sum()) > 0, name


def protocol_update_case(mech, variant, n: int) -> None:
    """An in-place change of the parameters (an optimiser step) reaches the SAME operator: the
    second call equals the updated problem's reference per slice (no stale cache or copy)."""
    assert variant.protocol == "update"
    _variant_passes(mech, variant, n, seed=1)


def protocol_learnable_case(mech, variant, n: int) -> None:
    """Forward with leaves requiring grad (both dtypes, per slice) and the float64 directional
    derivative against the central difference of the float64 reference."""
    assert variant.protocol == "learnable"
    _variant_passes(mech, variant, n, seed=2)
