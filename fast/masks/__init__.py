"""Mask operators: M @ x in sub-quadratic time, one module per family (twins of reference/masks/)."""
