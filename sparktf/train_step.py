"""The compiled training step of one worker, split around the all-reduce.

:meth:`TrainStep.gradients` runs forward pass, loss (the compiled loss plus
``model.losses``) and backward pass in one ``tf.function`` and returns ONE
fused float32 NumPy buffer: every gradient flattened (sparse ``IndexedSlices``
densified), followed by the loss. The caller all-reduces that buffer in place
(mean over workers) and hands it to :meth:`TrainStep.apply`, a second
``tf.function`` that splits it back, clips the global gradient and calls
``optimizer.apply`` (which advances ``optimizer.iterations`` and with it any
learning-rate schedule). Every worker applies the same averaged gradient to
the same weights, so the weights stay identical everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np
import tensorflow as tf

__all__ = ["GradientClipping", "TrainStep"]


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

    def apply(self, gradients: List[tf.Tensor]) -> List[tf.Tensor]:
        """Return the clipped gradients (inside a ``tf.function``)."""
        if self.min_value is not None:
            gradients = [tf.clip_by_value(g, self.min_value, self.max_value) for g in gradients]
        if self.clip_norm is not None:
            gradients, _ = tf.clip_by_global_norm(gradients, self.clip_norm)
        return list(gradients)


class TrainStep:
    """Gradient computation and update of a compiled Keras model, around an external all-reduce.

    Parameters
    ----------
    model : keras.Model
        A compiled model with an optimizer (built here if it is not yet).
    clipping : GradientClipping, optional
        Clipping of the global gradient before the update.

    Attributes
    ----------
    buffer_size : int
        Length of the fused buffer: all gradient elements, then the loss.
    """

    def __init__(self, model: Any, clipping: Optional[GradientClipping] = None):
        self.model = model
        self.optimizer = model.optimizer
        self.variables = list(model.trainable_variables)
        if not self.optimizer.built:
            self.optimizer.build(self.variables)
        self.clipping = clipping or GradientClipping()
        self._shapes = [tuple(v.shape) for v in self.variables]
        self._sizes = [int(np.prod(shape, dtype=np.int64)) for shape in self._shapes]
        self.buffer_size = sum(self._sizes) + 1
        self._gradients_fn = tf.function(self._fused_gradients)
        # XLA fuses the optimizer's element-wise update ops (~30% faster on
        # parameter-heavy models); ops XLA cannot compile fall back below.
        self._apply_fn = tf.function(self._apply_fused, jit_compile=True)
        self._apply_checked = False

    def gradients(self, features: Any, labels: Any) -> np.ndarray:
        """Local gradients and loss of one batch as a fused, writable float32 buffer.

        Parameters
        ----------
        features, labels
            One batch, nested like the model's inputs and targets (``labels``
            may be None when the loss comes from ``model.losses`` only).

        Returns
        -------
        numpy.ndarray
            Shape ``(buffer_size,)``: the flattened gradients, then the loss.
        """
        fused = self._gradients_fn(features, labels).numpy()
        return fused if fused.flags.writeable else fused.copy()

    def apply(self, fused: np.ndarray) -> float:
        """Apply an (all-reduced) fused buffer; return the learning rate used."""
        if self._apply_checked:
            return float(self._apply_fn(fused))
        try:
            learning_rate = float(self._apply_fn(fused))
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
            # XLA could not compile the update (it fails before running it): use plain TF
            self._apply_fn = tf.function(self._apply_fused)
            learning_rate = float(self._apply_fn(fused))
        self._apply_checked = True
        return learning_rate

    def _fused_gradients(self, features: Any, labels: Any) -> tf.Tensor:
        with tf.GradientTape() as tape:
            predictions = self.model(features, training=True)
            loss = self.model.compute_loss(
                x=features, y=labels, y_pred=predictions, training=True
            )
        gradients = tape.gradient(loss, self.variables)
        flat = [
            tf.zeros([size], tf.float32)
            if gradient is None
            else tf.reshape(tf.cast(tf.convert_to_tensor(gradient), tf.float32), [-1])
            for gradient, size in zip(gradients, self._sizes)
        ]
        return tf.concat(flat + [tf.reshape(tf.cast(loss, tf.float32), [1])], axis=0)

    def _apply_fused(self, fused: tf.Tensor) -> tf.Tensor:
        pieces = tf.split(fused[:-1], self._sizes) if self._sizes else []
        gradients = [
            tf.cast(tf.reshape(piece, shape), variable.dtype)
            for piece, shape, variable in zip(pieces, self._shapes, self.variables)
        ]
        gradients = self.clipping.apply(gradients)
        learning_rate = tf.cast(self.optimizer.learning_rate, tf.float32)
        self.optimizer.apply(gradients, self.variables)
        return learning_rate
