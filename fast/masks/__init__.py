"""Mask operators: M @ x in sub-quadratic time, one module per family (twins of reference/masks/)."""
from fast.masks.base import MaskOperator

__all__ = ["MaskOperator"]
