"""Hand-written GPU kernels of fast/ (Triton), each beside the PyTorch code it twins.

- fast.kernels.causal_scan: CausalMask's chunked causal scan, forward and backward, with the
  per-key stabiliser (fast.masks.sequence keeps the PyTorch scan as its fallback and twin).
- fast.kernels.favor_features: the FAVOR+ exponentials favor_attention takes for a mask whose key
  constants come from the keys' row maxima (fast.features.favor_exponentials is the twin).

Triton is optional: nothing here imports it until a kernel is asked for, and the masks fall back
to their PyTorch paths where it is absent (docs/design.md, "The Triton causal scan").
"""
