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
from fast.batching import BatchIndex, check_batch
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
from fast.graphs import Graph, as_graph, normalized_adjacency
from fast.latent.layers import DIFFormerAttention, NodeFormerConv, SGFormerAttention
from fast.masks.diffusion import DiffusionMask, expm_action
from fast.masks.explicit import DenseMask, SparseMask, as_mask_operator
from fast.masks.grf import GRFAsymMask, GRFMask, WalkFeatures, grf_features
from fast.masks.hypercube import HypercubeDiffusionMask
from fast.masks.lowrank import LowRankMask
from fast.masks.power_series import PowerSeriesMask
from fast.masks.rwgnk import RWGNKMask
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
from fast.operator import MaskOperator, SymmetricMaskOperator
from fast.latent.nodeformer import (
    adjacency_orders,
    edge_log_likelihood,
    edge_loss,
    gumbel_noise,
    kernelized_attention_rows,
    kernelized_gumbel_softmax,
    kernelized_softmax,
    nodeformer_attention,
    relational_bias,
)
from fast.latent.simple_attention import difformer_attention, frobenius_normalize, sgformer_attention
from fast.walks import Walks, sample_walks

__all__ = [
    "DenominatorError", "favor_attention", "favor_features", "linear_attention", "masked_linear_attention",
    "softmax_attention", "EluPlusOne", "FavorPlus", "FeatureMap", "Hyperbolic", "Identity",
    "ReLU", "TrigRFF", "gaussian_projection", "MaskOperator", "SymmetricMaskOperator", "DenseMask", "SparseMask",
    "as_mask_operator", "CausalMask", "PackingMask",
    "PaddingMask", "ToeplitzMask", "BlockToeplitzMask", "LowRankMask", "HypercubeDiffusionMask",
    "Forest", "TreeExpMask", "TreeDiamMask", "TreeDCMask", "forest_diameter", "tree_mask_operator",
    "Graph", "as_graph", "normalized_adjacency", "Walks", "sample_walks", "DiffusionMask", "expm_action",
    "PowerSeriesMask", "WalkFeatures", "grf_features", "GRFMask", "GRFAsymMask", "RWGNKMask",
    "BatchIndex", "check_batch", "gumbel_noise", "kernelized_softmax", "kernelized_gumbel_softmax", "adjacency_orders",
    "relational_bias", "nodeformer_attention", "kernelized_attention_rows", "edge_log_likelihood", "edge_loss",
    "frobenius_normalize", "difformer_attention", "sgformer_attention", "NodeFormerConv", "DIFFormerAttention",
    "SGFormerAttention",
]
