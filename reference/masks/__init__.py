"""Dense N x N masks, one module per mechanism family (twins of fast/masks/)."""
