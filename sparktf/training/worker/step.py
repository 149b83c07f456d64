"""The compiled training step of one worker, with the gradient exchange inside the graph.

:meth:`TrainStep.run` is two ``tf.function`` calls per iteration (one for a small model). The step:
forward pass, loss (the compiled loss plus ``model.losses``, weighted by the
batch's sample weights), backward pass and the compiled metrics' update on
this batch alone; the gradients, the loss and the batch's metric states
(:mod:`sparktf.training.metric_state`) packed for the exchange
(:mod:`sparktf.training.worker.gradient_exchange`: dense gradients fused in one
buffer, ``Embedding`` gradients as the rows they touch), gradients and loss
scaled by the worker's share of the global batch; the caller's exchange (sum
over workers: the record-weighted mean of gradients and loss, the global
batch's metric states), called from the graph through
``tf.numpy_function``. Then, only if every global gradient and the loss are
finite, the update: clipping of the global gradient and ``optimizer.apply``
(which advances ``optimizer.iterations`` and with it any learning-rate
schedule), a call of its own once the step has let go of the weights it
read (a small model without tables: inside the step), XLA-compiled where
XLA can compile it (rows in the form :mod:`sparktf.training.tables.update_form`
finds for the optimizer). Every worker
applies the same global gradient to the same weights, so the weights stay
identical everywhere. Like Keras' own train function, the step is traced
without AutoGraph: the model's Python runs as it is.

The global metric states add up over the epoch in a float64 variable of the
step; the metrics' values on that sum (the running epoch value ``fit``
shows) come back with every iteration, the same on every worker.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from sparktf.errors import InternalError
from sparktf.training.clipping import GradientClipping, map_values
from sparktf.training.metric_state import (build_metrics, metric_results, metric_variables, result_names,
                                           training_metrics)
from sparktf.training.tables.compiled_update import lowers_to_hlo, update_in_form
from sparktf.training.tables.sparse_kernels import apply_rows
from sparktf.training.tables.update_form import TableUpdates
from sparktf.training.worker.failures import exchange_failure
from sparktf.training.worker.gradient_exchange import ExchangedParts, GradientExchange, GradientLayout

__all__ = ["GradientClipping", "StepResult", "TrainStep"]

_LOG = logging.getLogger("sparktf.training")
#: Updates of a model without tables a process applies before it XLA-compiles the update.
COMPILE_AFTER_UPDATES = 32
#: A model without tables and with at most this many trainable variables updates inside its step.
FUSED_UPDATE_MAX_VARIABLES = 32


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
    """Gradients and external exchange of a compiled Keras model in one graph call, then its update in another
    (a small model without tables: in the same).

    Parameters
    ----------
    model : keras.Model
        A compiled model with an optimizer (built here if it is not yet).
    clipping : GradientClipping, optional
        Clipping of the global gradient before the update.
    table_updates : TableUpdates, optional
        How the optimizer updates tables, as the driver probed it (None: probed here when a table needs it).
    sharded : frozenset
        The positions among the trainable variables of the tables their owners update
        (``training.tables.worker_tables``): the step leaves them alone.
    """

    def __init__(self, model: Any, clipping: Optional[GradientClipping] = None,
                 table_updates: Optional[TableUpdates] = None, sharded: frozenset = frozenset()):
        self.model = model
        self._table_updates = table_updates  # as the driver probed them (None: probed here when a table needs it)
        self.optimizer = model.optimizer
        self.variables = list(model.trainable_variables)
        if not self.optimizer.built:
            self.optimizer.build(self.variables)
        self.clipping = clipping or GradientClipping()
        self._metrics: Optional[list] = None  # built from the first batch
        self._metric_variables: list = []
        self._metric_sizes: List[int] = []
        self._metric_state: Optional[tf.Variable] = None
        self.metric_names: List[str] = []
        self._exchange_call = _ExchangeCall()  # the traced step calls it; each run gives it that run's exchange
        self._update_fns: dict = {}  # by the positions of the gradients that travel as rows, and compiled or not
        self._sharded = frozenset(sharded)
        self._xla_update: Optional[Any] = None  # an update in the step: its XLA-compiled function, once it takes it
        self._compile_tried = False  # whether the update in the step was lowered to XLA (or found not to lower)
        self._last_compiled = False  # whether the last iteration's update ran XLA-compiled
        self._updates = 0  # applied in this process, warm-up included
        # mixed_float16: Keras' LossScaleOptimizer scales the loss before the gradients; the
        # scaled float32 gradients are exchanged, and its apply() unscales them, skips a
        # non-finite step (identically on every rank: all hold the same sum) and adjusts the scale
        self._loss_scaled = hasattr(self.optimizer, "inner_optimizer") and hasattr(self.optimizer, "scale_loss")
        self._weight = tf.Variable(1.0, trainable=False, dtype=tf.float32)
        self._weight_value = 1.0
        self._traces: Dict[Any, Tuple[Any, _StepTrace]] = {}  # by the inputs' signature: the step, what it found
        self.warmed_up = False

    def warm_up(self, features: Any, labels: Any, sample_weight: Any = None, long_run: bool = False) -> None:
        """Trace and compile the step by running it once on a local batch, without exchange.

        This APPLIES an update: the caller assigns the state to train from
        afterwards (e.g. ``ModelState.apply_to``). Lets a worker pay the
        one-time tracing and compilation while it waits for its peers. A
        ``long_run`` (a stream's resident job) also takes the XLA-compiled
        update now, which other jobs take after :data:`COMPILE_AFTER_UPDATES`.
        """
        self.run(features, labels, GradientExchange(), sample_weight=sample_weight)
        if long_run and self.compile_pending:
            self._compile_update_in_step(next(iter(self._traces.values()))[1].layout)
            self.run(features, labels, GradientExchange(), sample_weight=sample_weight)
        self.warmed_up = True

    @property
    def compile_pending(self) -> bool:
        """Whether the step's update (in its graph) has not been lowered to XLA yet."""
        return not self._compile_tried and any(trace.update_in_step for _, trace in self._traces.values())

    def set_metric_state(self, state: Optional[np.ndarray] = None) -> None:
        """Start the epoch's metrics from ``state`` (a :meth:`metric_state`), or from nothing (None).

        Raises
        ------
        InternalError
            ``state`` is not of this model's metrics (its size differs).
        """
        if self._metric_state is None:
            return
        size = int(self._metric_state.shape[0])
        if state is not None and np.size(state) != size:
            raise InternalError(f"the epoch's metric state has {np.size(state)} values where the model's compiled "
                                f"metrics have {size}: please report this bug of sparktf's")
        start = np.zeros(size) if state is None else np.asarray(state)
        self._metric_state.assign(start.astype(np.float64))

    def metric_state(self) -> Optional[np.ndarray]:
        """The global metric states summed over the epoch so far (None before the first batch)."""
        return None if self._metric_state is None else self._metric_state.numpy()

    def run(
        self, features: Any, labels: Any, exchange: Callable[[GradientLayout, ExchangedParts], ExchangedParts],
        weight: float = 1.0, sample_weight: Any = None,
    ) -> StepResult:
        """Run one iteration on a local batch.

        Parameters
        ----------
        features, labels
            One batch, nested like the model's inputs and targets (``labels``
            may be None when the loss comes from ``model.losses`` only).
        exchange : callable
            ``exchange(layout, parts)`` returns the sums over all workers of
            the :class:`ExchangedParts` ``layout`` packed (a :class:`GradientExchange`).
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
        call = self._exchange_call
        call.begin(exchange)
        if self._metrics is None:
            self._build_metric_state(features, labels)
        if self._weight_value != weight:
            self._weight.assign(weight)
            self._weight_value = weight
        try:
            step, trace = self._traced_step(features, labels, sample_weight)
            outcome, update, sparse = step(features, labels, sample_weight)
        except tf.errors.OpError:
            if call.error is not None:  # the exchange's, not the model's: sparktf's own error
                raise exchange_failure(call.error) from call.error
            raise
        loss, learning_rate, finite, *metrics = outcome.numpy().tolist()
        if finite:  # never apply an update that would poison the weights (the step's own applied it only then)
            if trace.update_in_step:
                self._last_compiled = self._xla_update is not None
            else:
                built = self._update_function(trace.layout)
                built.function(update, sparse)
                self._last_compiled = built.compiled
            self._updates += 1
            if trace.update_in_step and self._updates >= COMPILE_AFTER_UPDATES and not self._compile_tried:
                self._compile_update_in_step(trace.layout)
        return StepResult(loss, learning_rate, bool(finite), tuple(metrics))

    def _traced_step(self, features: Any, labels: Any, sample_weight: Any) -> Tuple[Any, "_StepTrace"]:
        """The step's concrete function for these inputs (traced for their structure, shapes and dtypes), and what
        its trace found.

        Kept per signature here: ``tf.function``'s own lookup costs 0.1-0.3 ms
        a call, which counts on a small model's step.
        """
        signature = repr(tf.nest.map_structure(_input_signature, (features, labels, sample_weight)))
        traced = self._traces.get(signature)
        if traced is None:
            found: List[_StepTrace] = []  # the trace's finding, handed back by _step
            step = tf.function(lambda *batch: self._step(*batch, found), autograph=False)  # as Keras' train function
            concrete = step.get_concrete_function(features, labels, sample_weight)
            traced = self._traces[signature] = (concrete, found[-1])
        return traced

    @property
    def last_update_compiled(self) -> bool:
        """Whether the last iteration's update ran XLA-compiled."""
        return self._last_compiled

    def _build_metric_state(self, features: Any, labels: Any) -> None:
        """The compiled metrics' variables (built from this batch), their epoch sum, their result names."""
        if training_metrics(self.model):  # compiled metrics, not built yet (none: nothing to build)
            build_metrics(self.model, features, labels)
        self.metric_names = result_names(metric_results(training_metrics(self.model)))
        self._metrics = training_metrics(self.model) if self.metric_names else []
        self._metric_variables = metric_variables(self._metrics)
        self._metric_sizes = [int(np.prod(v.shape, dtype=np.int64)) for v in self._metric_variables]
        self._metric_state = tf.Variable(tf.zeros([sum(self._metric_sizes)], tf.float64), trainable=False)

    def _step(self, features: Any, labels: Any, sample_weight: Any,
              found: List["_StepTrace"]) -> Tuple[tf.Tensor, tf.Tensor, list]:
        """``(loss, learning rate, finite, metrics)``, the dense global gradients, the rows of the tables.

        A small model without tables applies its update here (see
        :meth:`_update_in_step`) and returns no gradients. What the trace
        found is appended to ``found``, which :meth:`_traced_step` keeps with it.
        """
        for metric in self._metrics:  # the states of this batch alone
            metric.reset_state()
        gradients, loss, predictions = self._gradients_and_loss(features, labels, sample_weight)
        if self._metrics:
            self.model.compute_metrics(features, labels, predictions, sample_weight=sample_weight)
        batch_states = [tf.reshape(v, [-1]) for v in self._metric_variables]
        layout = GradientLayout(self.variables, gradients)
        sent = layout.pack(gradients, self._weight, loss, batch_states)
        call = self._exchange_call
        received = tf.numpy_function(  # the exchange's structure is flat only at this edge
            lambda *arrays: call(layout, ExchangedParts.of_flat(arrays)).flat(), sent.flat(),
            layout.output_types, stateful=True)
        parts = layout.received(received, int(sent.fused.shape[0]))
        fused, sparse = parts.fused, layout.sparse_gradients(parts)
        update, loss = layout.dense_gradients(fused), layout.loss(fused)
        learning_rate = tf.cast(self.optimizer.learning_rate, tf.float32)
        # a loss-scaled gradient may overflow (the optimizer skips that step); the loss may never be non-finite, even
        # with finite gradients (a NaN from the first step whose gradients are zero)
        checked = [loss] if self._loss_scaled else [loss, update] + [slices.values for slices in sparse]
        finite = tf.logical_and(tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in checked])),
                                parts.finite > 0.5)  # and the sums the step does not see (sharded tables' rows)
        outcome = tf.stack([loss, learning_rate, tf.cast(finite, tf.float32)])
        if self._metrics:
            outcome = tf.concat([outcome, self._epoch_metrics(layout.metric_states(fused))], axis=0)
        if layout.sparse or len(self.variables) > FUSED_UPDATE_MAX_VARIABLES:
            found.append(_StepTrace(layout, update_in_step=False))
            return outcome, update, sparse
        function = self._xla_update or self._update_in_step(layout, jit_compile=False)
        applied = tf.cond(finite, lambda: function(update, []), lambda: tf.constant(False))
        found.append(_StepTrace(layout, update_in_step=True))
        with tf.control_dependencies([applied]):
            return tf.identity(outcome), None, None

    def _update_in_step(self, layout: GradientLayout, jit_compile: bool) -> Any:
        """The update of a small model without tables, as a ``tf.function`` the step's graph calls when finite.

        One call per iteration instead of two saves about 0.3 ms a step,
        which counts on a small model; on a large one the update in the
        step's graph makes its first trace and run much dearer (see
        ``docs/design/training.md``), so it keeps a call of its own
        (:data:`FUSED_UPDATE_MAX_VARIABLES`). The update runs as TensorFlow
        ops until the process has applied :data:`COMPILE_AFTER_UPDATES`,
        XLA-compiled from then on where XLA can compile it
        (:meth:`_compile_update_in_step`).
        """
        def apply(dense: tf.Tensor, sparse: list) -> tf.Tensor:
            return self._update(layout, dense, sparse)

        spec = [tf.TensorSpec([layout.gradient_size], tf.float32), []]
        return tf.function(apply, input_signature=spec, jit_compile=jit_compile, autograph=False)

    def _compile_update_in_step(self, layout: GradientLayout) -> None:
        """From the next run on, the step's update is XLA-compiled, where XLA lowers it to HLO.

        The step is traced again for it, once per process, here: a step
        holding both forms behind a switch would trace and instantiate the
        update twice in every process, while short jobs never switch.
        """
        self._compile_tried = True
        compiled = self._update_in_step(layout, jit_compile=True)
        if not _compiles(compiled, layout):
            return
        self._xla_update = compiled
        self._traces.clear()

    def _epoch_metrics(self, global_states: tf.Tensor) -> tf.Tensor:
        """Add the global batch's metric states to the epoch's; the metrics' values on the sum, flat."""
        total = self._metric_state.assign_add(tf.cast(global_states, tf.float64))
        pieces = tf.split(total, self._metric_sizes) if self._metric_sizes else []
        for variable, piece in zip(self._metric_variables, pieces):
            variable.assign(tf.cast(tf.reshape(piece, variable.shape), variable.dtype))
        results = metric_results(self._metrics).values()
        return tf.concat([tf.reshape(tf.cast(value, tf.float32), [-1]) for value in results], axis=0)

    def _gradients_and_loss(self, features: Any, labels: Any, sample_weight: Any) -> Tuple[list, tf.Tensor, Any]:
        """Every gradient (a tensor, ``tf.IndexedSlices`` or None), the loss, the predictions."""
        with tf.GradientTape() as tape:
            predictions = self.model(features, training=True)
            loss = self.model.compute_loss(
                x=features, y=labels, y_pred=predictions, sample_weight=sample_weight, training=True
            )
            scaled = self.optimizer.scale_loss(loss) if self._loss_scaled else loss
        return tape.gradient(scaled, self.variables), loss, predictions

    def _update_function(self, layout: GradientLayout) -> "_Update":
        """The update for ``layout``'s global gradients as a ``tf.function`` of its own, XLA-compiled where XLA can
        compile it.

        It runs after the step, once the step has let go of the weights it
        read (a table's row update would otherwise copy the table). XLA fuses
        the optimizer's element-wise ops, and updates a table's rows without
        switching the table to copy-on-read (see ``training.tables.update_form``);
        lowering to HLO checks that it can compile the update without
        running it. Rows change in number at every step: they reach the
        compiled update as ``update_form`` says (the dense gradient, or rows
        padded to a few shapes), or go to the optimizer's exact row update
        (``"kernel"``), or to Keras' own through TensorFlow ops. A model
        without tables is compiled only once this process has applied
        :data:`COMPILE_AFTER_UPDATES` of its updates: the compile costs
        seconds on a large model, which only a long job repays.
        """
        compile_now = bool(layout.sparse) or self._updates >= COMPILE_AFTER_UPDATES
        key = (tuple(table.position for table in layout.sparse), compile_now)
        if key not in self._update_fns:
            self._update_fns[key] = self._built_update(layout, compile_now)
        return self._update_fns[key]

    def _built_update(self, layout: GradientLayout, compile_now: bool) -> "_Update":
        """The update as TensorFlow ops, or (``compile_now``) XLA-compiled where ``update_form`` and XLA allow."""
        if layout.sparse and self._table_updates is None:
            self._table_updates = TableUpdates.probe(self.optimizer)
        form = self._table_updates.form(len(layout.sparse)) if layout.sparse else "dense"
        function, compiled = update_in_form(
            form, lambda dense, sparse: self._update(layout, dense, sparse),
            lambda dense, sparse: self._update(layout, dense, sparse, row_kernels=True),
            [tf.TensorSpec([layout.gradient_size], tf.float32)], [table.shape for table in layout.sparse],
            compile_now and not self._sharded)  # sharded tables' rows: their owners apply them
        return _Update(function, compiled)

    def _update(self, layout: GradientLayout, dense: tf.Tensor, sparse: List[tf.IndexedSlices],
                row_kernels: bool = False) -> tf.Tensor:
        """Clip the global gradients and apply them: all through ``optimizer.apply``, or (``row_kernels``) each
        table's rows through :func:`~sparktf.training.tables.sparse_kernels.apply_rows` first, then the rest."""
        gradients = [None if position in self._sharded else map_values(lambda v: tf.cast(v, variable.dtype), g)
                     for position, (g, variable) in enumerate(zip(layout.gradients(dense, sparse), self.variables))]
        if not self._loss_scaled:
            gradients = self.clipping.apply(gradients)
        elif self.clipping.active:  # clip the true gradients; the optimizer takes scaled ones
            scale = self.optimizer.scale_loss(tf.constant(1.0, tf.float32))
            unscaled = self.clipping.apply([map_values(lambda v: v / scale, g) for g in gradients])
            gradients = [map_values(lambda v: v * scale, g) for g in unscaled]
        if not row_kernels:
            kept = [(g, v) for position, (g, v) in enumerate(zip(gradients, self.variables))
                    if position not in self._sharded]
            self.optimizer.apply([g for g, _ in kept], [v for _, v in kept])
            return tf.constant(True)
        tables = {table.position for table in layout.sparse} - self._sharded
        for position in sorted(tables):  # before apply(), which advances iterations (the schedule's step)
            apply_rows(self.optimizer, self.variables[position], gradients[position], unique_indices=True)
        rest = [(g, v) for position, (g, v) in enumerate(zip(gradients, self.variables))
                if position not in tables | self._sharded]
        if rest:
            self.optimizer.apply([g for g, _ in rest], [v for _, v in rest])
        else:
            self.optimizer.iterations.assign_add(1)
        return tf.constant(True)


@dataclass(frozen=True)
class _StepTrace:
    """What tracing the step found, kept beside its concrete function (``TrainStep._traces``, by the inputs'
    signature): a retrace has its own."""

    layout: GradientLayout  # which gradients travel dense, which as rows
    update_in_step: bool  # False: the update is a call of its own


@dataclass(frozen=True)
class _Update:
    """A built update: its ``tf.function`` ``(dense gradients, rows) -> True``, and whether XLA compiles it."""

    function: Any
    compiled: bool


class _ExchangeCall:
    """The step graph's call of the gradient exchange: each run's exchange (:meth:`begin`), and what it raised
    (``tf.numpy_function`` hands on only its text)."""

    def __init__(self) -> None:
        self._exchange: Optional[Callable[[GradientLayout, ExchangedParts], ExchangedParts]] = None
        self.error: Optional[BaseException] = None

    def begin(self, exchange: Callable[[GradientLayout, ExchangedParts], ExchangedParts]) -> None:
        """The exchange of the run that starts."""
        self._exchange, self.error = exchange, None

    def __call__(self, layout: GradientLayout, parts: ExchangedParts) -> ExchangedParts:
        try:
            return self._exchange(layout, parts)
        except BaseException as error:
            self.error = error
            raise


def _compiles(compiled: Any, layout: GradientLayout) -> bool:
    """Whether XLA lowers ``compiled`` (an update of ``layout``'s dense gradients, a model without tables) to HLO."""
    return lowers_to_hlo(compiled, tf.zeros([layout.gradient_size]), [])


def _input_signature(value: Any) -> Any:
    """What a step's trace depends on of one input: its shape and dtype (a Python value as itself)."""
    shape = getattr(value, "shape", None)
    return value if shape is None else (tuple(shape), str(value.dtype))
