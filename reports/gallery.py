"""Mask gallery: the dense mask M of a small instance of every registered mechanism that has one.

Every mechanism computes out_i = sum_j M_ij K(q_i, k_j) v_j / sum_j M_ij K(q_i, k_j); the gallery
shows M itself, exactly as ``mech.dense_mask(mech.make_problem(n, seed))`` builds it from
reference/. Only summary numbers (n, min, max, fraction of nonzeros, error) go into
results.json; the (n, n) matrices stay in memory for the figure and are rebuilt from the
registry when a page is re-rendered from JSON (``restore_matrices``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: Default gallery size: a power of two (hypercube masks) and a square (8 x 8 grid masks).
GALLERY_N = 64
GALLERY_SEED = 0


@dataclass
class MaskPanel:
    """One mechanism's mask at size ``n`` (``admissible(requested n)``).

    matrix: (n, n) float64, or None when building it failed (``error`` says why) or when the panel
    was loaded from results.json (summary only). min / max / nonzero_fraction describe the matrix;
    they are None when there is no matrix. ``note`` flags a re-drawn matrix that differs from the
    stored summary.
    """

    id: str
    n: int
    min: float | None = None
    max: float | None = None
    nonzero_fraction: float | None = None
    error: str | None = None
    matrix: np.ndarray | None = field(default=None, repr=False, compare=False)
    note: str = field(default="", compare=False)

    def to_dict(self) -> dict:
        """The JSON summary: no matrix."""
        return {"id": self.id, "n": self.n, "min": self.min, "max": self.max,
                "nonzero_fraction": self.nonzero_fraction, "error": self.error}


@dataclass
class MaskGallery:
    """The gallery: requested size ``n``, problem seed, one panel per mechanism with a dense mask.

    without_mask: ids of registered mechanisms whose ``dense_mask`` is None (not drawn, but listed).
    note: how the gallery was obtained when it was not built by the run (e.g. on re-render).
    """

    n: int
    seed: int
    panels: list[MaskPanel]
    without_mask: list[str] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict:
        return {"n": self.n, "seed": self.seed, "panels": [p.to_dict() for p in self.panels],
                "without_mask": list(self.without_mask), "note": self.note}

    @classmethod
    def from_dict(cls, d: dict) -> "MaskGallery":
        """Inverse of ``to_dict`` (panels come back without matrices)."""
        return cls(d["n"], d["seed"], [MaskPanel(**p) for p in d["panels"]], list(d.get("without_mask", [])),
                   d.get("note", ""))

    @property
    def errors(self) -> list[MaskPanel]:
        return [p for p in self.panels if p.error is not None]


def summarise(matrix: np.ndarray) -> tuple[float, float, float]:
    """(min, max, fraction of entries != 0) of a mask, any shape."""
    m = np.asarray(matrix, dtype=np.float64)
    return float(m.min()), float(m.max()), float(np.count_nonzero(m)) / m.size


def _admissible(mech, n: int) -> int:
    # Mechanism.admissible(n) (nearest admissible size <= n) may not exist yet: fall back to n.
    return int(getattr(mech, "admissible", lambda k: k)(n))


def mask_panel(mech, n: int = GALLERY_N, seed: int = GALLERY_SEED) -> MaskPanel:
    """Build one panel: problem at ``admissible(n)``, its dense mask, the summary.

    Never raises: an exception anywhere (admissible, make_problem, dense_mask) or a result that is
    not a finite, non-negative (n, n) matrix becomes ``error`` ("Type: message") with no matrix.
    """
    size = n
    try:
        size = _admissible(mech, n)
        if not 1 <= size <= n:
            raise ValueError(f"admissible({n}) returned {size}, not in [1, {n}]")
        m = np.asarray(mech.dense_mask(mech.make_problem(size, seed)), dtype=np.float64)
        if m.shape != (size, size):
            raise ValueError(f"dense_mask returned shape {m.shape}, expected ({size}, {size})")
        if not np.isfinite(m).all():
            raise ValueError(f"dense_mask has {int((~np.isfinite(m)).sum())} non-finite entries")
        lo, hi, nz = summarise(m)
        if lo < 0:
            raise ValueError(f"dense_mask has negative entries (min {lo:.3g})")
    except Exception as exc:  # noqa: BLE001 - one broken mask must not take the report down
        return MaskPanel(mech.id, size, error=f"{type(exc).__name__}: {exc}")
    return MaskPanel(mech.id, size, lo, hi, nz, matrix=m)


def mask_gallery(mechs=None, n: int = GALLERY_N, seed: int = GALLERY_SEED) -> MaskGallery:
    """Panels for every mechanism in ``mechs`` (default: the registry) whose dense_mask is not None."""
    if mechs is None:
        from verify.registry import mechanisms

        mechs = mechanisms()
    with_mask = [m for m in mechs if m.dense_mask is not None]
    return MaskGallery(n, seed, [mask_panel(m, n, seed) for m in with_mask],
                       [m.id for m in mechs if m.dense_mask is None])


def restore_matrices(gallery: MaskGallery) -> MaskGallery:
    """Rebuild the matrices of a gallery loaded from results.json, from this checkout's registry.

    Panels that recorded an error stay as they are. A panel whose mechanism is no longer
    registered, or whose rebuilt mask fails or disagrees with the stored summary, gets a ``note``
    (the stored numbers are kept: they describe the run that wrote the JSON).
    """
    from verify.registry import mechanisms

    by_id = {m.id: m for m in mechanisms()}
    for p in gallery.panels:
        if p.matrix is not None or p.error is not None:
            continue
        mech = by_id.get(p.id)
        if mech is None or mech.dense_mask is None:
            p.note = "not in this checkout's registry: no picture"
            continue
        again = mask_panel(mech, p.n, gallery.seed)
        if again.matrix is None:
            p.note = f"re-drawing failed: {again.error}"
            continue
        p.matrix = again.matrix
        same = all(a is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
                   for a, b in ((p.min, again.min), (p.max, again.max), (p.nonzero_fraction, again.nonzero_fraction)))
        if not same or again.n != p.n:
            p.note = "re-drawn from this checkout; differs from results.json"
    return gallery
