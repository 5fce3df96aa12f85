"""PyTorch implementations that reach each mechanism's claimed complexity.

Never builds an N x N matrix (except DenseMask, a mask the user gives whole). Device- and dtype-agnostic, batched over leading dims (..., N, d),
differentiable. Never imports ``reference`` and never touches global RNG state.
"""
from fast.attention import (
    DenominatorError,
    favor_attention,
    favor_features,
    linear_attention,
    masked_linear_attention,
    softmax_attention,
)
from fast.features import (
    EluPlusOne,
    FavorPlus,
    FeatureMap,
    Hyperbolic,
    Identity,
    ReLU,
    TrigRFF,
    gaussian_projection,
)
from fast.masks.base import MaskOperator, SymmetricMaskOperator
from fast.masks.explicit import DenseMask, SparseMask, as_mask_operator
from fast.masks.hypercube import HypercubeDiffusionMask
from fast.masks.lowrank import LowRankMask
from fast.masks.sequence import CausalMask, PackingMask, PaddingMask
from fast.masks.toeplitz import BlockToeplitzMask, ToeplitzMask
from fast.masks.tree import (
    Forest,
    TreeDCMask,
    TreeDiamMask,
    TreeExpMask,
    forest_diameter,
    tree_mask_operator,
)

__all__ = [
    "DenominatorError", "favor_attention", "favor_features", "linear_attention", "masked_linear_attention",
    "softmax_attention", "EluPlusOne", "FavorPlus", "FeatureMap", "Hyperbolic", "Identity",
    "ReLU", "TrigRFF", "gaussian_projection", "MaskOperator", "SymmetricMaskOperator", "DenseMask", "SparseMask",
    "as_mask_operator", "CausalMask", "PackingMask",
    "PaddingMask", "ToeplitzMask", "BlockToeplitzMask", "LowRankMask", "HypercubeDiffusionMask",
    "Forest", "TreeExpMask", "TreeDiamMask", "TreeDCMask", "forest_diameter", "tree_mask_operator",
]
