"""Latent-graph attention: NodeFormer (wu22), DIFFormer and SGFormer, and their nn.Module layers.

These are functions rather than masks: the graph they attend over is learned (NodeFormer's
kernelized Gumbel-softmax) or absent (DIFFormer, SGFormer's global all-pair term), so they sit next
to ``fast.masks`` and reuse the same driver (``fast.attention.masked_linear_attention``) and the same
segment plumbing (``fast.segments``) for batches of graphs.

- ``fast.latent.nodeformer``: kernelized (Gumbel-)softmax, relational bias, edge loss (wu22).
- ``fast.latent.simple_attention``: DIFFormer's and SGFormer's O(N d^2) attention.
- ``fast.latent.layers``: NodeFormerConv, DIFFormerAttention, SGFormerAttention (nn.Module).
"""
