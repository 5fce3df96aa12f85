"""Latent-graph attention: NodeFormer (wu22), DIFFormer and SGFormer, and their nn.Module layers.

Functions rather than masks: the graph they attend over is learned (NodeFormer) or absent
(DIFFormer, SGFormer), so they sit next to ``fast.masks`` and reuse its driver
(fast.attention.masked_linear_attention) and segment plumbing (fast.segments). Modules:
``nodeformer`` (kernelized (Gumbel-)softmax, relational bias, edge loss), ``simple_attention``
(DIFFormer's and SGFormer's O(N d^2) attention) and ``layers`` (their nn.Modules).
"""
