"""Planted bugs of issue 9's kinds 1 and 2 (leading dims; options and stateful paths): each one,
patched into a COPY of a fast/ code path with monkeypatch (never left in the code), makes
equivalence/<id> fail, and the real code passes the same check.

Kind 1 (batch and head dims, verify.favor.batch_magnitudes): a key stabiliser taken across the
batch (FAVOR+'s default, causal's running max, packing's, padding's) and a causal scan whose
running state flows from one batch element into the next. Kind 2 (options and stateful paths): a packing mask that
compares runs instead of ids, a padding stabiliser that looks at padded keys, a spectrum cache
that ignores the table's version (an in-place update is not seen), a learnable table whose
spectrum is detached from it.

The Toeplitz bugs run equivalence on a copy of the record restricted to the protocol variant
(the check's reasons and statistic are per variant, so the full check fails whenever one of its
variants does); the sequence records run whole.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

import fast
import fast.features
from fast.masks import sequence as fast_sequence
from fast.masks import toeplitz as fast_toeplitz
from results.check import Context
from verify.checks import equivalence
from verify.mechanisms import get


def _all_dims(z: torch.Tensor) -> tuple[int, ...]:
    return tuple(range(z.dim()))


# ------------------------------------------------------------------------------ the planted copies


def _slice_max_across_batch(rows):
    """fast.features.slice_max (the keys' default FAVOR+ constant from their row maxima) taken over
    the WHOLE tensor (all slices) instead of one (batch, head) slice."""
    return rows.amax(dim=_all_dims(rows), keepdim=True)  # BUG: across batch and heads


_DECAYED_SCAN = fast_sequence._decayed_scan


def _causal_stabilizer_across_batch(self, z):
    """CausalMask.key_stabilizer whose running max is also taken over every slice at once."""
    run = torch.cummax(z.amax(-1), dim=-1).values
    lead = tuple(range(run.dim() - 1))
    return run.amax(dim=lead, keepdim=True).expand_as(run).unsqueeze(-1)  # BUG: across batch and heads


def _leaky_decayed_scan(x, level, reverse=False):
    """fast.masks.sequence._decayed_scan whose forward states also carry the previous (batch, head)
    slice's final state: the batch seen as one sequence, the last chunk of one slice handing its
    state to the chunks of the next (decayed by the level difference, capped at 1)."""
    s = _DECAYED_SCAN(x, level, reverse)
    if reverse or s.dim() < 4:
        return s
    flat, lev = s.reshape(-1, *s.shape[-3:]), level.reshape(-1, level.shape[-1])
    carry = torch.roll(flat[:, -1:], 1, dims=0)  # BUG: the previous slice's last state
    carry[0] = 0
    decay = torch.exp(torch.clamp(torch.roll(lev[:, -1:], 1, dims=0) - lev, max=0))[..., None, None]
    return (flat + decay * carry).reshape(s.shape)


def _never_narrow(self, c):
    """CausalMask._narrow (and _one_per_slice, below) saying False: FAVOR+ takes the decayed scan
    (where the leak above is planted) rather than the plain scan on one constant per slice."""
    return torch.zeros((), dtype=torch.bool, device=c.device)


def _packing_stabilizer_across_batch(self, z):
    """PackingMask.key_stabilizer with each segment's max taken over every sample and head too."""
    row = z.amax(-1)
    lead = torch.broadcast_shapes(row.shape[:-1], self.segment_index.shape[:-1])
    row = row.expand(*lead, self.n)
    idx = self.segment_index.to(z.device).expand(*lead, self.n)
    seg = torch.full((*lead, self.num_segments), -torch.inf, dtype=z.dtype, device=z.device)
    seg = seg.scatter_reduce(-1, idx, row, reduce="amax", include_self=True)
    seg = seg.amax(dim=tuple(range(seg.dim() - 1)), keepdim=True).expand_as(seg)  # BUG: across the batch
    return torch.gather(seg, -1, idx).unsqueeze(-1)


def _padding_stabilizer_across_batch(self, z):
    """PaddingMask.key_stabilizer with the real keys' max taken over every sample and head."""
    row = z.amax(-1, keepdim=True)
    real = self.key_mask.to(z.device).unsqueeze(-1)
    c = row.masked_fill(~real, -torch.inf).amax(dim=_all_dims(row), keepdim=True)  # BUG: not per slice
    return torch.where(real, c, row)


def _padding_stabilizer_all_keys(self, z):
    """PaddingMask.key_stabilizer = the max over ALL keys of the slice, padded ones included."""
    return z.amax(dim=(-2, -1), keepdim=True)  # BUG: padded keys set the scale


def _packing_runs_init(self, segment_ids):
    """PackingMask.__init__ that numbers RUNS of equal ids: two runs with the same id never meet."""
    self.n = segment_ids.shape[-1]
    change = torch.ones_like(segment_ids, dtype=torch.int64)
    change[..., 1:] = (segment_ids[..., 1:] != segment_ids[..., :-1]).to(torch.int64)  # BUG: runs, not ids
    self.segment_index = torch.cumsum(change, dim=-1) - 1
    self.num_segments = int(self.segment_index.max()) + 1


def _spectrum(self, device, dtype, *, versioned=True, detach=False):
    """BlockToeplitzMask.spectrum with a cache (the real one has none: it recomputes) and a switch for
    each planted bug: versioned=False keys the cache without the table's version (stale after an
    in-place update); detach=True cuts the table from the graph (a learnable table gets no gradient)."""
    cache = self.__dict__.setdefault("_planted_spectra", {})
    learnable = self.table.requires_grad and torch.is_grad_enabled()
    key = (str(device), dtype, self.table._version if versioned else 0)
    if not learnable and key in cache:
        return cache[key]
    t = (self.table.detach() if detach else self.table).to(device=device, dtype=dtype)
    pad = []
    for w, nf in zip(reversed(t.shape), reversed(self.n_fft)):
        pad += [0, nf - w]
    first_col = torch.nn.functional.pad(t, pad)
    first_col = torch.roll(first_col, shifts=[-(n - 1) for n in self.grid_shape], dims=list(range(len(self.n_fft))))
    spec = torch.fft.rfftn(first_col, s=self.n_fft)
    if not learnable:
        cache[key] = spec.detach()
    return spec


def _stale_spectrum(self, device, dtype):
    return _spectrum(self, device, dtype, versioned=False)


def _detached_spectrum(self, device, dtype):
    return _spectrum(self, device, dtype, detach=True)


#: name -> (record id, variant restriction or None for the whole record, [(owner, attribute, copy)])
PLANTED = {
    "favor-stabiliser-across-batch/linear": (
        "linear", None, [(fast.features, "slice_max", _slice_max_across_batch)]),
    "favor-stabiliser-across-batch/causal": (
        "causal", None, [(fast.CausalMask, "key_stabilizer", _causal_stabilizer_across_batch)]),
    "causal-state-leaks-across-batch": ("causal", None, [(fast_sequence, "_decayed_scan", _leaky_decayed_scan),
                                                         (fast.CausalMask, "_narrow", _never_narrow),
                                                         (fast.CausalMask, "_one_per_slice", _never_narrow)]),
    "packing-stabiliser-across-batch": (
        "packing", None, [(fast.PackingMask, "key_stabilizer", _packing_stabilizer_across_batch)]),
    "padding-stabiliser-across-batch": (
        "padding", None, [(fast.PaddingMask, "key_stabilizer", _padding_stabilizer_across_batch)]),
    "padding-stabiliser-over-padded-keys": (
        "padding", None, [(fast.PaddingMask, "key_stabilizer", _padding_stabilizer_all_keys)]),
    "packing-compares-runs": ("packing", None, [(fast.PackingMask, "__init__", _packing_runs_init)]),
    "stale-spectrum-cache": (
        "toeplitz-1d", "update", [(fast_toeplitz.BlockToeplitzMask, "spectrum", _stale_spectrum)]),
    "spectrum-detached-from-learnable-table": (
        "toeplitz-1d", "learnable", [(fast_toeplitz.BlockToeplitzMask, "spectrum", _detached_spectrum)]),
}


def _record(mech_id: str, variant: str | None):
    mech = get(mech_id)
    return mech if variant is None else dataclasses.replace(mech, variants=(mech.variant(variant),))


def run_planted(name: str, monkeypatch=None):
    """(result on the real code, result with the bug planted) of equivalence on the bug's record.
    Without monkeypatch (a script measuring the numbers) the patch is undone in a finally."""
    mech_id, variant, patches = PLANTED[name]
    check = equivalence.check_for(_record(mech_id, variant))
    good = check.evaluate(Context(quick=True))
    saved = [(owner, attr, owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr))
             for owner, attr, _ in patches]
    try:
        for owner, attr, planted in patches:
            if monkeypatch is not None:
                monkeypatch.setattr(owner, attr, planted)
            else:
                setattr(owner, attr, planted)
        bad = check.evaluate(Context(quick=True))
    finally:
        if monkeypatch is None:
            for owner, attr, value in saved:
                setattr(owner, attr, value)
    return good, bad


# ------------------------------------------------------------------------------ the tests


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_bug_fails_equivalence_and_the_real_code_passes(name, monkeypatch):
    good, bad = run_planted(name, monkeypatch)
    assert good.status == "pass", good.details["reasons"]
    assert good.statistic <= good.threshold == 1.0
    assert good.details["float64_max_rel_error"] <= equivalence.TOL["float64"]
    assert good.details["float32_max_rel_error"] <= equivalence.TOL["float32"]
    assert bad.status == "fail"
    assert bad.details["reasons"]
    assert bad.statistic > bad.threshold  # every planted bug here fails through an error over its tolerance


@pytest.mark.parametrize("name", ["favor-stabiliser-across-batch/linear", "favor-stabiliser-across-batch/causal",
                                  "packing-stabiliser-across-batch", "padding-stabiliser-across-batch",
                                  "padding-stabiliser-over-padded-keys"])
def test_stabiliser_bugs_underflow_the_quiet_slice_in_float32(name, monkeypatch):
    """A stabiliser moved by other slices (or padded keys) by >= 126 in exponent: float32 features
    of the quiet slice underflow (a DenominatorError or garbage), float64 still represents them."""
    _, bad = run_planted(name, monkeypatch)
    assert bad.details["float32_max_rel_error"] > equivalence.TOL["float32"]
    assert bad.details["float64_max_rel_error"] <= equivalence.TOL["float64"]
    assert bad.statistic > 1 and bad.details["worst_component"] == "float32"
    assert all("float32" in r for r in bad.details["reasons"])


@pytest.mark.parametrize("name", ["causal-state-leaks-across-batch", "packing-compares-runs"])
def test_wrong_mixing_is_reported_at_its_slice(name, monkeypatch):
    """Wrong in float64 too, and the details name the (batch, head) slice."""
    _, bad = run_planted(name, monkeypatch)
    assert bad.details["float64_max_rel_error"] > 1e-2 and bad.statistic > 1
    assert "(b=" in bad.details["worst_slice"] and all("(b=" in r for r in bad.details["reasons"])


def test_stale_cache_is_named_as_such(monkeypatch):
    _, bad = run_planted("stale-spectrum-cache", monkeypatch)
    assert bad.details["float64_max_rel_error"] > 1e-3  # the updated call returns the old parameters' output
    assert bad.statistic > 1
    assert any("stale cache" in r for r in bad.details["reasons"])


def test_detached_table_fails_the_gradient(monkeypatch):
    good, bad = run_planted("spectrum-detached-from-learnable-table", monkeypatch)
    assert good.details["grad_max_rel_error"]["learnable"] <= equivalence.GRAD_TOL
    # the forward is right: only the gradient is wrong, and it sets the statistic
    assert bad.details["float64_max_rel_error"] <= equivalence.TOL["float64"]
    assert bad.statistic > 1 and bad.details["worst_component"] == "gradient"
    assert any("gradient" in r for r in bad.details["reasons"])
