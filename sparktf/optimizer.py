"""``TFOptimizer``: synchronous data-parallel training of a Keras model on Spark barrier tasks.

It checks its arguments and hands the training to its
:class:`~sparktf.training.driver.session.TrainingSession` (the model, where
training stands, its payload and tables), with its settings at each call;
see ``docs/design/training.md``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from sparktf.data.batch_maps import MappedElements
from sparktf.data.specs import leaf_specs
from sparktf.errors import ConfigurationError
from sparktf.inference.feeds import feature_leaves, keras_feed
from sparktf.models.rebuild_check import check_rebuildable
from sparktf.spark.calls import call_scope
from sparktf.spark.resources import ResourceProfileLike, stage_profile
from sparktf.streaming.stream_dataset import resolved_for
from sparktf.summary import TrainSummary, ValidationSummary
from sparktf.training.driver import (GradientClipping, RunRequest, RunSettings, TableStrategy, TrainingSession,
                                     check_labels, check_membership, check_optimize, check_settings,
                                     checked_profile_steps, compile_with_loss, default_verbose, find_checkpoint,
                                     log_table_updates, recompile)
from sparktf.triggers import EveryEpoch, MaxEpoch, Trigger

__all__ = ["TFOptimizer"]


class TFOptimizer:
    """Distributed synchronous training of a compiled Keras model.

    Create it with :meth:`from_keras` or :meth:`from_loss`, then call
    :meth:`optimize`.

    Parameters
    ----------
    model : keras.Model
        A compiled model (loss and optimizer set).
    dataset : TFDataset
        Training data (with ``batch_size`` for :meth:`optimize`), optionally with validation data.
    model_dir : str, optional
        Folder for checkpoints, written by the driver: a local path or a URI (``hdfs://``, ``s3a://``, ``gs://``,
        ... see ``docs/guides/storage.md``). With sharded embedding tables the workers keep the tables' optimizer
        slots under ``model_dir/tables``, so every executor must reach it (``docs/guides/recommendation.md``).
    num_workers : int, optional
        Number of barrier tasks (default ``sc.defaultParallelism``).
    max_failures : int
        How many failed segments are relaunched before giving up.
    collective_timeout : float
        Seconds a worker waits for its peers in an all-reduce.
    min_workers : int, optional
        Elastic training: the fewest workers training goes on with when executors are lost (default ``num_workers``:
        never fewer).
    replace_wait : float
        Seconds a launch waits for lost task slots to come back before it goes on with fewer workers (or, below
        ``min_workers``, gives up).
    gradient_compression : {None, "bf16", "fp16"}
        Send the gradients through the all-reduce as bfloat16 or float16: half the bytes of float32 (None, the
        default); sums stay float32. "fp16" needs gradient sums below 65504: prefer "bf16" (see
        ``docs/guides/training.md``).
    resource_profile : pyspark.resource.ResourceProfile or dict, optional
        What each training task needs, e.g. ``{"cpus": 4, "gpus": 1}``: only the training (and its validation)
        stages ask for it, ETL stages keep the session's defaults; see ``docs/guides/gpu.md``. Not in local mode.
    keep_checkpoints : int or None
        How many of the newest checkpoints stay in ``model_dir`` (default 5); older ones are deleted once a new one
        is complete. None keeps all.
    sharded_tables : "session", "auto", list of str or None
        Which ``Embedding`` tables are sharded across the workers, with their optimizer slots: ``"auto"`` every
        table whose rows and slots exceed ``spark.sparktf.shardTableBytes`` (default 256m), a list exactly those
        layers, None none; ``"session"`` (the default) the session's ``spark.sparktf.shardTables`` and
        ``shardTableBytes``. A name that is not an ``Embedding`` of the model is a ``ConfigurationError``. See
        ``docs/guides/recommendation.md``.
    """

    def __init__(
        self,
        model: Any,
        dataset: Any,
        model_dir: Optional[str] = None,
        num_workers: Optional[int] = None,
        max_failures: int = 3,
        collective_timeout: float = 300,
        min_workers: Optional[int] = None,
        replace_wait: float = 60,
        *,
        gradient_compression: Optional[str] = None,
        resource_profile: ResourceProfileLike = None,
        keep_checkpoints: Optional[int] = 5,
        sharded_tables: Any = "session",
    ):
        check_settings(dataset, num_workers, max_failures, collective_timeout, model_dir, gradient_compression,
                       keep_checkpoints)
        check_rebuildable(model)  # before any job: a model the executors cannot rebuild
        if dataset.is_streaming:  # the lengths its schema does not tell come from the model
            dataset = resolved_for(dataset, model)
        elements = _check_data_fits(model, dataset)  # by dataset: its batches as the model gets them
        self.session = dataset.blocks.kind
        self.model = model
        self.dataset = dataset
        self.model_dir = model_dir
        self.keep_checkpoints = keep_checkpoints
        self.num_workers = int(num_workers or self.session.default_parallelism())
        self.min_workers = check_membership(self.num_workers, min_workers, replace_wait)
        self.replace_wait = float(replace_wait)
        self.max_failures = int(max_failures)
        self.collective_timeout = float(collective_timeout)
        self.gradient_compression = gradient_compression
        self.resource_profile = stage_profile(self.session, resource_profile)
        self.clipping = GradientClipping()
        self.train_summary: Optional[TrainSummary] = None
        self.val_summary: Optional[ValidationSummary] = None
        self.history: Any = None  # the last optimize call's keras.callbacks.History
        # builds the model's optimizer
        tables = TableStrategy.of(model, self.session, self.num_workers, model_dir, sharded_tables)
        log_table_updates(model, tables.updates)
        #: The model, where training stands (what the next call resumes from), its payload and tables.
        self.training_session = TrainingSession(model, tables, elements, self.session.share)

    # ------------------------------------------------------------------ factories

    @classmethod
    def from_keras(
        cls,
        keras_model: Any,
        dataset: Any,
        optimizer: Any = None,
        model_dir: Optional[str] = None,
        metrics: Optional[List[Any]] = None,
        num_workers: Optional[int] = None,
        max_failures: int = 3,
        collective_timeout: float = 300,
        min_workers: Optional[int] = None,
        replace_wait: float = 60,
        *,
        gradient_compression: Optional[str] = None,
        resource_profile: ResourceProfileLike = None,
        keep_checkpoints: Optional[int] = 5,
        sharded_tables: Any = "session",
    ) -> "TFOptimizer":
        """Train a compiled Keras model with its own loss, optimizer and metrics.

        Parameters
        ----------
        keras_model : keras.Model
            Must be compiled, unless ``optimizer`` is given (then the model is
            compiled with it, keeping its loss and metrics).
        dataset : TFDataset
            Training data.
        optimizer : keras.optimizers.Optimizer or str, optional
            Replaces the compiled optimizer.
        model_dir : str, optional
            Directory for checkpoints.
        metrics : list, optional
            Replaces the compiled metrics (used by validation and evaluate).
        num_workers, max_failures, collective_timeout, min_workers, replace_wait, gradient_compression,
        resource_profile, keep_checkpoints, sharded_tables
            See the class description.

        Returns
        -------
        TFOptimizer

        Raises
        ------
        DataError
            When the model is not compiled and no ``optimizer`` is given.
        """
        recompile(keras_model, optimizer, metrics)
        return cls(keras_model, dataset, model_dir, num_workers, max_failures, collective_timeout, min_workers,
                   replace_wait, gradient_compression=gradient_compression, resource_profile=resource_profile,
                   keep_checkpoints=keep_checkpoints, sharded_tables=sharded_tables)

    @classmethod
    def from_loss(
        cls,
        model: Any,
        loss_fn: Any,
        optim_method: Any,
        dataset: Any,
        metrics: Optional[List[Any]] = None,
        model_dir: Optional[str] = None,
        num_workers: Optional[int] = None,
        max_failures: int = 3,
        collective_timeout: float = 300,
        min_workers: Optional[int] = None,
        replace_wait: float = 60,
        *,
        gradient_compression: Optional[str] = None,
        resource_profile: ResourceProfileLike = None,
        keep_checkpoints: Optional[int] = 5,
        sharded_tables: Any = "session",
    ) -> "TFOptimizer":
        """Train a Keras model with a loss function and an optimizer.

        The model is compiled with ``loss=loss_fn``, ``optimizer=optim_method``
        and ``metrics``; ``loss_fn`` may be defined in the user's script or
        notebook (it travels by value).

        Parameters
        ----------
        model : keras.Model
            The model to train.
        loss_fn : callable
            ``loss_fn(y_true, y_pred) -> scalar tensor``.
        optim_method : keras.optimizers.Optimizer or str
            The optimizer.
        dataset : TFDataset
            Training data.
        metrics : list, optional
            Metrics for validation and evaluate.
        model_dir, num_workers, max_failures, collective_timeout, min_workers, replace_wait,
        gradient_compression, resource_profile, keep_checkpoints, sharded_tables
            See the class description.

        Returns
        -------
        TFOptimizer
        """
        compile_with_loss(model, loss_fn, optim_method, metrics)
        return cls(model, dataset, model_dir, num_workers, max_failures, collective_timeout, min_workers,
                   replace_wait, gradient_compression=gradient_compression, resource_profile=resource_profile,
                   keep_checkpoints=keep_checkpoints, sharded_tables=sharded_tables)

    # ------------------------------------------------------------------ settings

    def set_train_summary(self, summary: TrainSummary) -> "TFOptimizer":
        """Write ``Loss``, ``Throughput`` and ``LearningRate`` of every iteration to ``summary``."""
        if not isinstance(summary, TrainSummary):
            raise TypeError(f"expected a TrainSummary, got {summary!r}")
        self.train_summary = summary
        return self

    def set_val_summary(self, summary: ValidationSummary) -> "TFOptimizer":
        """Write the validation loss and metrics of every validation to ``summary``."""
        if not isinstance(summary, ValidationSummary):
            raise TypeError(f"expected a ValidationSummary, got {summary!r}")
        self.val_summary = summary
        return self

    def set_constant_gradient_clipping(self, min_value: float, max_value: float) -> "TFOptimizer":
        """Clip every element of the global (all-reduced) gradient to ``[min_value, max_value]``."""
        if not min_value <= max_value:
            raise ValueError(f"min_value {min_value} must be <= max_value {max_value}")
        self.clipping = GradientClipping(float(min_value), float(max_value), self.clipping.clip_norm)
        return self

    def set_gradient_clipping_by_l2_norm(self, clip_norm: float) -> "TFOptimizer":
        """Rescale the global (all-reduced) gradient so that its L2 norm is at most ``clip_norm``."""
        if not clip_norm > 0:
            raise ValueError(f"clip_norm must be positive, got {clip_norm}")
        self.clipping = GradientClipping(self.clipping.min_value, self.clipping.max_value, float(clip_norm))
        return self

    # ------------------------------------------------------------------ training

    def optimize(
        self,
        end_trigger: Trigger = MaxEpoch(1),
        checkpoint_trigger: Trigger = EveryEpoch(),
        validation_trigger: Optional[Trigger] = None,
        callbacks: Optional[Sequence[Any]] = None,
        verbose: Optional[int] = None,
        class_weight: Optional[Dict[int, float]] = None,
        *, checkpoint_failures: int = 3,
        profile_steps: Optional[Tuple[int, int]] = None,
    ) -> Dict[str, Any]:
        """Train until ``end_trigger`` fires (or a callback sets ``model.stop_training``).

        Parameters
        ----------
        end_trigger : Trigger
            When to stop (absolute counters: a resumed run that already reached it trains nothing).
        checkpoint_trigger : Trigger
            When to write a checkpoint to ``model_dir`` (if set).
        validation_trigger : Trigger, optional
            When to validate on the dataset's validation data (default: ``checkpoint_trigger``).
        callbacks : list of keras.callbacks.Callback, optional
            Run on the driver with Keras' hook names and ``logs`` (see ``docs/guides/training.md`` for which work):
            segments then end at every epoch end, where validation runs when there is validation data.
        verbose : int, optional
            0 silent, 1 a progress bar per epoch, 2 one line per epoch; default 1 in a terminal or notebook, else 2.
        class_weight : dict, optional
            Class index -> weight, as ``fit``'s: a record's loss is weighted by its label's class weight (times its
            sample weight, if the dataset has them). Training only, not validation; single-output models.
        checkpoint_failures : int
            Failed checkpoint writes in a row that stop training (default 3); fewer are logged and retried.
        profile_steps : tuple of int, optional
            ``(start, end)``: the iterations (absolute, inclusive) whose phases every rank records; the call then
            writes a Chrome-trace JSON (one track per rank, open it in Perfetto or ``chrome://tracing``) to
            ``model_dir`` (a temporary folder for a remote or no ``model_dir``), whose path is
            :attr:`last_timeline`.

        Returns
        -------
        dict
            ``{"loss": [one value per iteration of this call], "<metric>": [one value per epoch completed in this
            call], "val_<metric>": [one value per validation], "iterations": n, "epochs": e}`` with the absolute
            counters at the end; a training metric is the compiled metric over the epoch's records, as ``fit``
            reports it.

        Raises
        ------
        DataError
            When the dataset has no ``batch_size`` (or it does not fit ``num_workers``); for a ``class_weight`` that
            does not fit the labels.
        SparkTFError
            When ``min_workers`` (default ``num_workers``) is more than the cluster's task slots.
        TrainingError
            When the loss becomes non-finite, training failed more than ``max_failures`` times, or fewer than
            ``min_workers`` slots are left after ``replace_wait``.
        StorageError
            After ``checkpoint_failures`` failed checkpoint writes in a row, or when the last one was never written.
        """
        if self.dataset.is_streaming:
            raise ConfigurationError("optimize trains a dataset of records that exist now, but this TFOptimizer's "
                                     "dataset is a streaming one: call optimize_stream() instead")
        end_trigger, checkpoint_trigger, validation_trigger, class_weight = check_optimize(
            self.model, self.dataset, self.num_workers, (end_trigger, checkpoint_trigger, validation_trigger),
            class_weight)
        request = RunRequest(end_trigger, checkpoint_trigger, validation_trigger, list(callbacks or []),
                             default_verbose() if verbose is None else verbose, class_weight, checkpoint_failures,
                             profile_steps=checked_profile_steps(profile_steps))
        result, self.history = self.training_session.run(self.dataset, self.run_settings(self.num_workers),
                                                         self.clipping, request, (self.train_summary, self.val_summary))
        return result

    def optimize_stream(self, trigger: Optional[Dict[str, Any]] = None, publish_every: Optional[int] = None,
                        checkpoint_location: Optional[str] = None, callbacks: Optional[Sequence[Any]] = None,
                        max_staged: int = 2, publish_if: Optional[Callable[[Dict[str, Any]], bool]] = None,
                        full_every: Optional[int] = None, resident: Optional[bool] = None,
                        continue_model: bool = False) -> Any:
        """Train continuously on a streaming dataset, each micro-batch exactly once; returns the running query.

        Each micro-batch is evaluated with the model as it stands (test-then-train: ``test_loss``,
        ``test_<metric>``), then trained on in one pass of global batches of ``batch_size`` (the last one partial;
        in order without ``shuffle``). Its checkpoint records the query's id and ``batchId``: a query restarted on
        the same ``model_dir`` and ``checkpoint_location`` trains no micro-batch twice or not at all. Where the
        session has a task slot beside the ``num_workers`` ranks, one training job stays up for the whole query
        while ``foreachBatch`` stages the micro-batches. See ``docs/guides/streaming.md``.

        Parameters
        ----------
        trigger : dict, optional
            ``DataStreamWriter.trigger`` keywords, e.g. ``{"processingTime": "2 seconds"}`` or
            ``{"availableNow": True}`` (default: Spark's).
        publish_every : int, optional
            Every this many trained micro-batches, a version is published to ``model_dir/published/<version>/``
            for ``TFPredictor.from_published`` (the newest ``keep_checkpoints`` kept). None publishes nothing.
        checkpoint_location : str, optional
            The query's own checkpoint (offsets, commits); default ``model_dir/stream``. Another query's than
            the one the model's checkpoint trained is refused (its micro-batches would all train again).
        callbacks : list of keras.callbacks.Callback, optional
            Run on the driver: ``on_train_begin``, then ``on_epoch_begin(batchId)`` and ``on_epoch_end(batchId,
            logs)`` per micro-batch, ``logs`` holding ``loss``, the ``test_*`` metrics and ``records``.
        max_staged : int
            A resident job's back-pressure: at most this many micro-batches staged and untrained (``foreachBatch``
            waits for training before it stages one more).
        publish_if : callable, optional
            A quality gate on ``logs``, e.g. ``lambda m: m["test_auc"] >= 0.7``: a due version it refuses is not
            published (``publish_refused`` in the progress) and stays due.
        full_every : int, optional
            Versions between full ones hold the dense weights and only the table rows changed since the previous
            one; every ``full_every``-th is full (None: all). ``from_published`` applies them.
        resident : bool, optional
            None: a resident job where the slots allow, else a job per micro-batch (said once in the log).
            False: a job per micro-batch. True: resident, or a ``ConfigurationError`` saying why not.
        continue_model : bool
            The query is a new one that continues the model trained by another (see ``checkpoint_location``).

        Returns
        -------
        pyspark.sql.streaming.StreamingQuery
            The running query, whose ``training_progress`` lists each micro-batch's metrics and timings.

        Raises
        ------
        ConfigurationError
            Before any job: the dataset is not a streaming one, ``model_dir`` is missing, a setting is wrong, the
            session is a Spark Connect one (its ``foreachBatch`` runs on the server), or ``checkpoint_location``
            is another query's.
        """
        from sparktf.streaming.query import start_training_query

        return start_training_query(self, trigger=trigger, publish_every=publish_every,
                                    checkpoint_location=checkpoint_location, callbacks=list(callbacks or []),
                                    max_staged=max_staged, publish_if=publish_if, full_every=full_every,
                                    resident=resident, continue_model=continue_model)

    def run_settings(self, workers: int) -> RunSettings:
        """This optimizer's settings for a training call on ``workers`` workers (as they are now)."""
        return RunSettings(session=self.session, num_workers=workers, min_workers=min(self.min_workers, workers),
                           replace_wait=self.replace_wait, max_failures=self.max_failures,
                           collective_timeout=self.collective_timeout,
                           gradient_compression=self.gradient_compression, resource_profile=self.resource_profile,
                           model_dir=self.model_dir, keep_checkpoints=self.keep_checkpoints,
                           tables=self.training_session.tables)

    # ------------------------------------------------------------------ where training stands

    @property
    def iteration(self) -> int:
        """Iterations trained so far (absolute: from a loaded checkpoint on)."""
        return self.training_session.state.iteration

    @property
    def last_loss(self) -> Optional[float]:
        """The loss of the last iteration trained (None before any)."""
        return self.training_session.state.last_loss

    @property
    def last_score(self) -> Optional[float]:
        """The score of the last validation (None before any)."""
        return self.training_session.state.last_score

    @property
    def last_timings(self) -> Dict[str, float]:
        """The last segment's seconds per phase: set-up (launch, model load, ...) and the step's (data, lookup,
        compute, exchange, apply)."""
        return self.training_session.state.last_timings

    @property
    def rank_timings(self) -> Dict[int, Dict[str, float]]:
        """``{rank: {phase: seconds}}`` of the last call, summed over its segments.

        The step phases (``data``, ``lookup``, ``compute``, ``exchange_wait``, ``transfer``, ``apply``), the
        exchange's parts (``send``, ``receive``, ``waited``, ``delivery``), ``lost_seconds`` (the others' waits for
        the rank), the set-up phases (``model_load``, ...): see ``docs/guides/training.md``, "Why is it slow?"."""
        return self.training_session.state.rank_timings

    @property
    def stragglers(self) -> List[Any]:
        """The last call's stragglers: records with ``rank``, ``executor``, ``host``, ``phase`` and ``factor`` (its
        median seconds per step in ``phase`` over the other ranks' median), the slowest first."""
        return self.training_session.state.stragglers

    @property
    def last_timeline(self) -> Optional[str]:
        """The Chrome-trace JSON written by the last ``optimize(profile_steps=...)`` (None before one)."""
        return self.training_session.state.last_timeline

    @property
    def last_traffic(self) -> Any:
        """The last segment's gradient bytes on rank 0 (``training.worker.gradient_exchange.Traffic``), or None."""
        return self.training_session.state.last_traffic

    # ------------------------------------------------------------------ evaluation and state

    def evaluate(self, dataset: Any = None, batch_per_thread: Optional[int] = None, *,
                 resource_profile: ResourceProfileLike = None) -> Dict[str, float]:
        """Compute the compiled loss and metrics over every record of ``dataset``.

        Parameters
        ----------
        dataset : TFDataset, optional
            Data to evaluate (default: the training dataset).
        batch_per_thread : int, optional
            Records per batch in each partition (default: the dataset's
            ``batch_per_thread``, else ``batch_size // num_workers``).
        resource_profile : pyspark.resource.ResourceProfile or dict, optional
            What each evaluation task needs (default: the optimizer's own).

        Returns
        -------
        dict
            Metric name -> value (``"loss"`` included), record-weighted over
            all records like a local ``model.evaluate``.
        """
        dataset = self.dataset if dataset is None else dataset
        batch = batch_per_thread or dataset.inference_batch_size(self.num_workers)
        profile = self.resource_profile if resource_profile is None else stage_profile(self.session, resource_profile)
        with call_scope(self.session, "evaluate"):  # Ctrl-C in the driver cancels it, from any thread
            return self.training_session.evaluate(dataset, int(batch), self.collective_timeout, profile)

    def load_checkpoint(self, path: Optional[str] = None, version: Optional[int] = None) -> None:
        """Restore weights, optimizer state and the iteration counter from a checkpoint.

        Parameters
        ----------
        path : str, optional
            A checkpoint file, or a directory of them (default ``model_dir``).
        version : int, optional
            The iteration of the checkpoint to load from the directory
            (default: the latest).
        """
        self.training_session.restore(find_checkpoint(path, self.model_dir, version))


def _check_data_fits(model: Any, dataset: Any) -> Dict[int, MappedElements]:
    """Each dataset's batches as the model gets them, by ``id``; refuses data that does not fit, before any job."""
    found = {}
    for data in (dataset, dataset.val_dataset):
        if data is not None:
            found[id(data)] = elements = MappedElements.of(data, model)
            keras_feed(model, *feature_leaves(elements.element[0]))
            if len(elements.element) > 1:
                check_labels(model, leaf_specs(elements.element[1], "labels"))
    return found
