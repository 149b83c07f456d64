"""The compiled training step of one worker, with the all-reduce inside the graph.

:meth:`TrainStep.run` is ONE ``tf.function`` call per iteration: forward pass,
loss (the compiled loss plus ``model.losses``), backward pass and the
compiled metrics' update on this batch alone; every gradient flattened
(sparse ``IndexedSlices`` densified) into ONE float32 buffer followed by the
loss, both scaled by the worker's share of the global batch, then the
batch's metric states (:mod:`sparktf.training.metric_state`); the caller's
all-reduce (sum over workers: the record-weighted mean of gradients and
loss, the global batch's metric states) of that buffer, called from the graph
through ``tf.numpy_function``; then, only if every averaged gradient and the
loss are finite, the split back into gradients, clipping of the global
gradient and ``optimizer.apply`` (which advances ``optimizer.iterations`` and
with it any learning-rate schedule). The update is XLA-compiled when XLA can
compile it. Every worker applies the same averaged gradient to the same
weights, so the weights stay identical everywhere. Like Keras' own train
function, the step is traced without AutoGraph (the model's Python runs as
it is; tracing ResNet-50's step took 3 CPU-s less).

The global metric states add up over the epoch in a float64 variable of the
step; the metrics' values on that sum (the running epoch value ``fit``
shows) come back with every iteration, the same on every worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from sparktf.training.metric_state import (build_metrics, metric_results, metric_variables, result_names,
                                           training_metrics)

__all__ = ["GradientClipping", "StepResult", "TrainStep"]


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

    def apply(self, gradients: List[tf.Tensor]) -> List[tf.Tensor]:
        """Return the clipped gradients (inside a ``tf.function``)."""
        if self.min_value is not None:
            gradients = [tf.clip_by_value(g, self.min_value, self.max_value) for g in gradients]
        if self.clip_norm is not None:
            gradients, _ = tf.clip_by_global_norm(gradients, self.clip_norm)
        return list(gradients)


@dataclass(frozen=True)
class StepResult:
    """Outcome of one iteration.

    Attributes
    ----------
    loss : float
        Mean loss over the workers.
    learning_rate : float
        Learning rate of the update.
    applied : bool
        False when a gradient or the loss was not finite: nothing was applied
        (with loss scaling, only a non-finite loss; the optimizer itself skips
        a step whose scaled gradients overflowed, and lowers the scale).
    metrics : tuple of float
        The compiled metrics over the epoch so far, global batches up to this
        one included (``TrainStep.metric_names`` order).
    """

    loss: float
    learning_rate: float
    applied: bool
    metrics: Tuple[float, ...] = ()


class TrainStep:
    """Gradients, external all-reduce and update of a compiled Keras model in one graph call.

    Parameters
    ----------
    model : keras.Model
        A compiled model with an optimizer (built here if it is not yet).
    clipping : GradientClipping, optional
        Clipping of the global gradient before the update.

    Attributes
    ----------
    gradient_size : int
        The number of gradient elements, the fused buffer's first part; the
        loss and the metric states follow (they travel exactly, never
        compressed).
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
        self.gradient_size = sum(self._sizes)
        self._metrics: Optional[list] = None  # built from the first batch
        self._metric_variables: list = []
        self._metric_sizes: List[int] = []
        self._metric_state: Optional[tf.Variable] = None
        self.metric_names: List[str] = []
        self._allreduce: Optional[Callable[[np.ndarray], Any]] = None
        self._allreduce_error: Optional[BaseException] = None
        # mixed_float16: Keras' LossScaleOptimizer scales the loss before the gradients; the
        # scaled float32 gradients are all-reduced, and its apply() unscales them, skips a
        # non-finite step (identically on every rank: all hold the same sum) and adjusts the scale
        self._loss_scaled = hasattr(self.optimizer, "inner_optimizer") and hasattr(self.optimizer, "scale_loss")
        self._weight = tf.Variable(1.0, trainable=False, dtype=tf.float32)
        self._weight_value = 1.0
        self._update_fn = self._compiled_update()
        self._step_fn = tf.function(self._step, autograph=False)  # as Keras' own train function: ~20% less tracing
        self.warmed_up = False

    def warm_up(self, features: Any, labels: Any, sample_weight: Any = None) -> None:
        """Trace and compile the step by running it once on a local batch, without all-reduce.

        This APPLIES an update: the caller assigns the state to train from
        afterwards (e.g. ``ModelState.apply_to``). Lets a worker pay the
        one-time tracing and compilation while it waits for its peers.
        """
        self.run(features, labels, lambda buffer: None, sample_weight=sample_weight)
        self.warmed_up = True

    def set_metric_state(self, state: Optional[np.ndarray] = None) -> None:
        """Start the epoch's metrics from ``state`` (a :meth:`metric_state`), or from nothing (None)."""
        if self._metric_state is None:
            return
        size = int(self._metric_state.shape[0])
        start = np.zeros(size) if state is None or np.size(state) != size else np.asarray(state)
        self._metric_state.assign(start.astype(np.float64))

    def metric_state(self) -> Optional[np.ndarray]:
        """The global metric states summed over the epoch so far (None before the first batch)."""
        return None if self._metric_state is None else self._metric_state.numpy()

    def run(
        self, features: Any, labels: Any, allreduce: Callable[[np.ndarray], Any], weight: float = 1.0,
        sample_weight: Any = None,
    ) -> StepResult:
        """Run one iteration on a local batch.

        Parameters
        ----------
        features, labels
            One batch, nested like the model's inputs and targets (``labels``
            may be None when the loss comes from ``model.losses`` only).
        allreduce : callable
            Sums a contiguous float32 NumPy buffer over all workers, in
            place (e.g. ``lambda b: communicator.allreduce(b, op="sum")``).
        weight : float
            This worker's share of the global batch (its records / all
            records): the gradients and loss are scaled by it before the
            sum, which is then the record-weighted mean over the workers.
        sample_weight : array, optional
            One weight per record of the batch (as ``fit``'s
            ``sample_weight``, class weights already folded in): it weights
            the loss and the compiled metrics as in Keras' own train step.

        Returns
        -------
        StepResult
            The averaged loss, the learning rate, whether the update was applied.
        """
        self._allreduce, self._allreduce_error = allreduce, None
        if self._metrics is None:
            self._build_metric_state(features, labels)
        if self._weight_value != weight:
            self._weight.assign(weight)
            self._weight_value = weight
        try:
            values = self._step_fn(features, labels, sample_weight).numpy()
        except tf.errors.OpError as error:
            if self._allreduce_error is not None:  # e.g. CollectiveError: re-raise it as such
                raise self._allreduce_error from error
            raise
        loss, learning_rate, applied = values[:3]
        return StepResult(float(loss), float(learning_rate), bool(applied), tuple(float(v) for v in values[3:]))

    def _build_metric_state(self, features: Any, labels: Any) -> None:
        """The compiled metrics' variables (built from this batch), their epoch sum, their result names."""
        if training_metrics(self.model):  # compiled metrics, not built yet (none: nothing to build)
            build_metrics(self.model, features, labels)
        self.metric_names = result_names(metric_results(training_metrics(self.model)))
        self._metrics = training_metrics(self.model) if self.metric_names else []
        self._metric_variables = metric_variables(self._metrics)
        self._metric_sizes = [int(np.prod(v.shape, dtype=np.int64)) for v in self._metric_variables]
        self._metric_state = tf.Variable(tf.zeros([sum(self._metric_sizes)], tf.float64), trainable=False)

    def _step(self, features: Any, labels: Any, sample_weight: Any) -> tf.Tensor:
        for metric in self._metrics:  # the states of this batch alone
            metric.reset_state()
        pieces, predictions = self._gradients_and_loss(features, labels, sample_weight)
        if self._metrics:
            self.model.compute_metrics(features, labels, predictions, sample_weight=sample_weight)
        batch_states = [tf.reshape(tf.cast(v, tf.float32), [-1]) for v in self._metric_variables]
        fused = tf.concat([piece * self._weight for piece in pieces] + batch_states, axis=0)
        averaged = tf.numpy_function(self._allreduce_numpy, [fused], tf.float32, stateful=True)
        averaged.set_shape(fused.shape)
        update, loss = averaged[: self.gradient_size + 1], averaged[self.gradient_size]
        learning_rate = tf.cast(self.optimizer.learning_rate, tf.float32)
        # a loss-scaled gradient may overflow (the optimizer skips that step); the loss may not
        finite = tf.reduce_all(tf.math.is_finite(loss if self._loss_scaled else update))
        # never apply an update that would poison the weights
        applied = tf.cond(finite, lambda: self._update_fn(update), lambda: tf.constant(False))
        outcome = tf.stack([loss, learning_rate, tf.cast(applied, tf.float32)])
        if not self._metrics:
            return outcome
        return tf.concat([outcome, self._epoch_metrics(averaged[self.gradient_size + 1 :])], axis=0)

    def _epoch_metrics(self, global_states: tf.Tensor) -> tf.Tensor:
        """Add the global batch's metric states to the epoch's; the metrics' values on the sum, flat."""
        total = self._metric_state.assign_add(tf.cast(global_states, tf.float64))
        pieces = tf.split(total, self._metric_sizes) if self._metric_sizes else []
        for variable, piece in zip(self._metric_variables, pieces):
            variable.assign(tf.cast(tf.reshape(piece, variable.shape), variable.dtype))
        results = metric_results(self._metrics).values()
        return tf.concat([tf.reshape(tf.cast(value, tf.float32), [-1]) for value in results], axis=0)

    def _allreduce_numpy(self, buffer: np.ndarray) -> np.ndarray:
        """The caller's all-reduce, called from the graph (keeps its exception for :meth:`run`)."""
        if not buffer.flags.writeable:
            buffer = buffer.copy()
        try:
            self._allreduce(buffer)
        except BaseException as error:
            self._allreduce_error = error
            raise
        return buffer

    def _gradients_and_loss(self, features: Any, labels: Any, sample_weight: Any) -> Tuple[List[tf.Tensor], Any]:
        """Every gradient, then the loss, as flat float32 tensors; the predictions."""
        with tf.GradientTape() as tape:
            predictions = self.model(features, training=True)
            loss = self.model.compute_loss(
                x=features, y=labels, y_pred=predictions, sample_weight=sample_weight, training=True
            )
            scaled = self.optimizer.scale_loss(loss) if self._loss_scaled else loss
        gradients = tape.gradient(scaled, self.variables)
        flat = [
            tf.zeros([size], tf.float32)
            if gradient is None
            else tf.reshape(tf.cast(tf.convert_to_tensor(gradient), tf.float32), [-1])
            for gradient, size in zip(gradients, self._sizes)
        ]
        return flat + [tf.reshape(tf.cast(loss, tf.float32), [1])], predictions

    def _compiled_update(self) -> Any:
        """The update as a ``tf.function``, XLA-compiled when XLA can compile it.

        XLA fuses the optimizer's element-wise ops (2x faster on
        parameter-heavy models). Lowering to HLO checks that without running
        the update.
        """
        compiled = tf.function(self._update, jit_compile=True, autograph=False)
        try:
            compiled.experimental_get_compiler_ir(tf.zeros([self.gradient_size + 1]))(stage="hlo")
        except (ValueError, tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
            return tf.function(self._update, autograph=False)
        return compiled

    def _update(self, fused: tf.Tensor) -> tf.Tensor:
        pieces = tf.split(fused[:-1], self._sizes) if self._sizes else []
        gradients = [
            tf.cast(tf.reshape(piece, shape), variable.dtype)
            for piece, shape, variable in zip(pieces, self._shapes, self.variables)
        ]
        if not self._loss_scaled:
            gradients = self.clipping.apply(gradients)
        elif self.clipping.active:  # clip the true gradients; the optimizer takes scaled ones
            scale = self.optimizer.scale_loss(tf.constant(1.0, tf.float32))
            gradients = [g * scale for g in self.clipping.apply([g / scale for g in gradients])]
        self.optimizer.apply(gradients, self.variables)
        return tf.constant(True)
