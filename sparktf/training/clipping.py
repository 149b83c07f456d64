"""Clipping of the all-reduced (global) gradient: one rule for the step's graph and for a sharded table's rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import numpy as np
import tensorflow as tf

__all__ = ["GradientClipping", "map_values"]


@dataclass(frozen=True)
class GradientClipping:
    """Clipping applied to the all-reduced (global) gradient.

    Attributes
    ----------
    min_value, max_value : float, optional
        Element-wise bounds (``set_constant_gradient_clipping``).
    clip_norm : float, optional
        Bound on the global L2 norm of all gradients together
        (``set_gradient_clipping_by_l2_norm``).
    """

    min_value: Optional[float] = None
    max_value: Optional[float] = None
    clip_norm: Optional[float] = None

    @property
    def active(self) -> bool:
        """Whether any clipping is set."""
        return self.min_value is not None or self.clip_norm is not None

    def apply(self, gradients: List[Any]) -> List[Any]:
        """Return the clipped gradients, tensors or ``tf.IndexedSlices`` (inside a ``tf.function``)."""
        if self.min_value is not None:
            gradients = [map_values(lambda v: tf.clip_by_value(v, self.min_value, self.max_value), g)
                         for g in gradients]
        if self.clip_norm is not None:
            gradients, _ = tf.clip_by_global_norm(gradients, self.clip_norm)
        return list(gradients)

    def apply_to_rows(self, rows: np.ndarray) -> np.ndarray:
        """Return a sharded table's summed gradient rows clipped element-wise, on the host (the global norm needs
        every owner's rows: sharded tables refuse it before any job)."""
        return rows if self.min_value is None else np.clip(rows, self.min_value, self.max_value)


def map_values(function: Callable[[tf.Tensor], tf.Tensor], gradient: Any) -> Any:
    """``function`` applied to a dense gradient, or to the rows of a ``tf.IndexedSlices`` one (None: None)."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(function(gradient.values), gradient.indices, gradient.dense_shape)
    return function(gradient)
