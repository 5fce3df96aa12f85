"""Per-key stabilisation of the graph masks whose rows reach only nearby keys, or weigh them most
(GRFMask, GRFAsymMask, RWGNKMask, PowerSeriesMask, DiffusionMask): the generic part, shared by
fast.masks.grf, fast.masks.rwgnk, fast.masks.power_series and fast.masks.diffusion (each builds its
own rescaled product in ``_attend_stabilised``).

FAVOR+ features (fast.features) are exp(z - c) for a constant c the driver picks with the mask's
``key_stabilizer``. The default (fast.operator) is one max over all keys of a (batch, head) slice;
a row of these masks reaches only keys a few hops away, which may sit far below that max and
underflow. Here each key j gets its own constant c_j = max_a z_ja (``local_key_stabilizer``), and
the mask's ``attend(phi_q, phi_k, v, key_log_scale=c)`` (``LocallyStabilised``) undoes them exactly
on its stored values, returning (num, den) times one positive factor per query row, which cancels
in num / den (fast.masks.grf). O(N m) for the constants; the rescaled products cost what the
plain ones do.
"""
from __future__ import annotations

import torch

from fast.algebra import default_block_cols, features_per_block, masked_products
from fast.operator import MaskOperator, default_key_stabilizer
from fast.validation import check_key_log_scale, check_tokens, compute_dtype

__all__ = ["LocallyStabilised", "local_key_stabilizer", "log_scale_of", "plain_attend", "stabilised_inputs"]


def log_scale_of(key_log_scale: object, phi_k: torch.Tensor, n: int) -> torch.Tensor:
    """key_log_scale (..., N, 1), broadcastable to phi_k's leading dims (a floating tensor) as a
    detached (S, N) tensor in phi_k's dtype, S = the number of (batch, head) slices of phi_k. O(S N).
    ValueError / TypeError naming key_log_scale for a bad shape or dtype (fast.validation).

        >>> import torch
        >>> from fast.stabilizers import log_scale_of
        >>> tuple(log_scale_of(torch.zeros(2, 3, 1), torch.ones(2, 3, 4), 3).shape)
        (2, 3)
    """
    return check_key_log_scale(key_log_scale, phi_k, n).reshape(-1, n)


def local_key_stabilizer(op: MaskOperator, z: torch.Tensor) -> torch.Tensor:
    """key_stabilizer of a graph mask whose rows reach only nearby keys (GRF, RWGNK, power series):
    per-key constants c_j = max_a z_ja, (..., N, 1) detached, for z (..., N, m), which its attend
    undoes (rescales_keys). While the mask is not nonnegative (a signed f or alpha) the default
    per-slice max (..., 1, 1) instead: the driver's guard bounds a signed mask's terms with
    abs_matmul of the features it is given, which per-key constants would distort. O(N m).
    ValueError naming z when its token axis is not op.n.

        >>> import torch
        >>> from fast.stabilizers import local_key_stabilizer
        >>> import fast
        >>> mask = fast.PowerSeriesMask(fast.as_graph(torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])), [1.0, 0.5])
        >>> local_key_stabilizer(mask, torch.tensor([[0.0, 2.0], [1.0, -1.0], [3.0, 0.0]])).flatten().tolist()
        [2.0, 1.0, 3.0]
    """
    check_tokens("z", z, op.n)
    if not op.nonnegative:
        return default_key_stabilizer(z.detach())
    return z.detach().amax(-1, keepdim=True)


def stabilised_inputs(n: int, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor,
                      key_log_scale: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(phi_q, phi_k, v) in their compute dtype (fast.validation.compute_dtype of the three) and
    the constants c (S, N) of ``log_scale_of``: the common start of the stabilised attends. O(N (m + d)).

        >>> import torch
        >>> from fast.stabilizers import stabilised_inputs
        >>> q, k, v, c = stabilised_inputs(3, torch.ones(3, 2, dtype=torch.float16), torch.ones(3, 2),
        ...                                torch.ones(3, 1), torch.zeros(3, 1))
        >>> q.dtype, tuple(c.shape)
        (torch.float32, (1, 3))
    """
    work = compute_dtype(torch.promote_types(torch.promote_types(phi_q.dtype, phi_k.dtype), v.dtype))
    phi_q, phi_k, v = phi_q.to(work), phi_k.to(work), v.to(work)
    return phi_q, phi_k, v, log_scale_of(key_log_scale, phi_k, n)


def plain_attend(op: MaskOperator, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor):
    """(num (..., N, d), den (..., N)) of Algorithm 1 (choromanski22) through op's products by
    fast.algebra.masked_products, blocked as the driver's generic path (default_block_cols(v)
    columns per block). O(cost of op.matmul on N (m d + m) columns).

        >>> import torch
        >>> from fast.stabilizers import plain_attend
        >>> import fast
        >>> num, den = plain_attend(fast.LowRankMask(torch.ones(3, 1), torch.ones(1, 3)), torch.ones(3, 2),
        ...                         torch.ones(3, 2), torch.ones(3, 1))
        >>> num.flatten().tolist(), den.tolist()
        ([6.0, 6.0, 6.0], [6.0, 6.0, 6.0])
    """
    return masked_products(phi_q, phi_k, v, op, features_per_block(default_block_cols(v), v.shape[-1]))


def _empty_products(phi_q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(num, den) of an empty batch (no slice): zeros of the right shapes, connected to the inputs."""
    num = v * 0.0
    return num, (phi_q * 0.0).sum(-1)


class LocallyStabilised:
    """Mixin of the graph masks whose rows reach only nearby keys (GRFMask, GRFAsymMask, RWGNKMask,
    PowerSeriesMask, DiffusionMask): per-key constants (``local_key_stabilizer``) and an ``attend`` that undoes
    them (``rescales_keys``, fast.operator). attend(phi_q, phi_k, v, key_log_scale=None) ->
    (num (..., N, d), den (..., N)): with key_log_scale None the plain product (the driver's
    generic path, fast.algebra.masked_products through matmul); otherwise the inputs in their
    compute dtype and the constants c (S, N) go to the class's ``_attend_stabilised(phi_q, phi_k,
    v, c)``, which returns (num, den) of the true features times exp(-r_i) per query row i.

        >>> from fast.stabilizers import LocallyStabilised
        >>> import fast
        >>> issubclass(fast.GRFMask, LocallyStabilised), LocallyStabilised.rescales_keys
        (True, True)
    """

    #: attend takes key_log_scale: the per-key constants of key_stabilizer (fast.operator).
    rescales_keys = True

    def key_stabilizer(self, z: torch.Tensor) -> torch.Tensor:
        """Per-key constants c_j = max_a z_ja (..., N, 1), detached (``local_key_stabilizer``)."""
        return local_key_stabilizer(self, z)

    def attend(self, phi_q: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, *,
               key_log_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(num (..., N, d), den (..., N)) of Algorithm 1 with this mask (class doc)."""
        if key_log_scale is None:
            return plain_attend(self, phi_q, phi_k, v)
        phi_q, phi_k, v, c = stabilised_inputs(self.n, phi_q, phi_k, v, key_log_scale)
        if c.shape[0] == 0:
            return _empty_products(phi_q, v)
        return self._attend_stabilised(phi_q, phi_k, v, c)
