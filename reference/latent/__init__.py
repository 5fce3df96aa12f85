"""Dense twins of the learned latent graphs (fast.latent): NodeFormer (wu22) in
reference.latent.nodeformer, DIFFormer and SGFormer in reference.latent.simple_attention. O(N^2)."""
