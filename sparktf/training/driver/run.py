"""The driver's side of one ``TFOptimizer.optimize`` call: segments, checkpoints, membership, validation,
callbacks and history.

The driver trains in *segments*. A segment is one Spark barrier job of
``num_workers`` tasks (:func:`~sparktf.training.worker.loop.run_segment`, started
by :mod:`~sparktf.training.driver.segment_job`) that trains from the driver's state
until the first iteration where the end, checkpoint or validation trigger
fires, then hands the state back. Between segments the driver writes
summaries and checkpoints, validates and decides whether to go on. A failed
segment is relaunched from the last good state up to ``max_failures`` times;
with ``min_workers < num_workers`` training goes on with fewer workers while
executors are gone (:mod:`~sparktf.training.driver.membership`). See
``docs/design/training.md``.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from sparktf.data.batch_maps import MappedElements
from sparktf.data.sparse import model_structure
from sparktf.errors import DataError
from sparktf.spark.calls import call_scope, current_label
from sparktf.spark.cluster import watchdog_slack
from sparktf.spark.task_devices import gpu_plan
from sparktf.training.checkpoint import ModelState
from sparktf.training.clipping import GradientClipping
from sparktf.training.driver.anatomy import CallAnatomy, Straggler
from sparktf.training.driver.callbacks import DriverCallbacks
from sparktf.training.driver.checkpoint_writer import CheckpointWriter
from sparktf.training.driver.evaluation import evaluate_blocks
from sparktf.training.driver.inputs import WorkerInputs
from sparktf.training.driver.membership import Membership
from sparktf.training.driver.segment_job import SegmentRunner
from sparktf.training.driver.segment_records import record_segment, record_validation
from sparktf.training.tables.plan import ShardPlan, check_trainable
from sparktf.training.tables.strategy import TableStrategy
from sparktf.training.worker.segment_spec import SegmentResult, SegmentSpec
from sparktf.training.batch_schedule import BatchSchedule, EndlessBatches
from sparktf.triggers import EveryEpoch, MaxEpoch, TrainingProgress, Trigger, TriggerOr

__all__ = ["RunSettings", "RunState", "RunRequest", "TrainingRun", "evaluate_model"]


@dataclass(frozen=True)
class RunSettings:
    """How training runs: ``TFOptimizer``'s checked settings (see its docstring)."""

    session: Any
    num_workers: int
    min_workers: int
    replace_wait: float
    max_failures: int
    collective_timeout: float
    gradient_compression: Optional[str]
    resource_profile: Any
    model_dir: Optional[str]
    keep_checkpoints: Optional[int]
    tables: TableStrategy


@dataclass
class RunState:
    """Where training stands between ``optimize`` calls: what the next call resumes from.

    Attributes
    ----------
    iteration : int
        Iterations trained so far (absolute: a checkpoint's, then every call's).
    last_loss, last_score : float or None
        The last iteration's loss and the last validation's score (for triggers).
    metric_state : array or None
        The compiled metrics' states summed over the epoch so far.
    last_timings : dict
        The last segment's seconds per phase.
    last_traffic : Traffic or None
        The last segment's gradient bytes on rank 0.
    optimizer_state_folder : str or None
        The folder of the sharded tables' optimizer slots at ``iteration`` (None: fresh, or none sharded).
    stream : tuple or None
        ``(query id, batch id)`` of the last micro-batch of a stream trained into the state (None: none).
    publish_due : int
        The stream's micro-batches trained since its last published version.
    rank_timings : dict
        The last call's seconds per phase and rank (see :mod:`sparktf.training.driver.anatomy`).
    stragglers : list of Straggler
        The last call's stragglers.
    last_timeline : str or None
        The Chrome-trace JSON the last call with ``profile_steps`` wrote.
    """

    iteration: int = 0
    last_loss: Optional[float] = None
    last_score: Optional[float] = None
    metric_state: Any = None
    last_timings: Dict[str, float] = field(default_factory=dict)
    last_traffic: Any = None
    optimizer_state_folder: Optional[str] = None
    stream: Optional[Tuple[str, int]] = None
    publish_due: int = 0
    rank_timings: Dict[int, Dict[str, float]] = field(default_factory=dict)
    stragglers: List[Straggler] = field(default_factory=list)
    last_timeline: Optional[str] = None


@dataclass(frozen=True)
class RunRequest:
    """One ``optimize`` call's arguments, checked (see ``TFOptimizer.optimize``); a ``schedule`` of ``SinglePass``
    trains one pass over the dataset's records, its last batch partial (a stream's micro-batch)."""

    end_trigger: Trigger
    checkpoint_trigger: Trigger
    validation_trigger: Trigger
    callbacks: Sequence[Any]
    verbose: int
    class_weight: Any
    checkpoint_failures: int
    schedule: BatchSchedule = EndlessBatches()
    profile_steps: Optional[Tuple[int, int]] = None


class TrainingRun:
    """One ``optimize`` call on the driver: it trains ``model`` on ``dataset`` and moves ``state`` on.

    Parameters
    ----------
    model : keras.Model
        The driver's compiled model: it holds the state after every segment.
    dataset : TFDataset
        The training data, with its validation data if any.
    settings : RunSettings
        How to train.
    state : RunState
        Where training stands; updated after every segment.
    clipping : GradientClipping
        Of the global gradient.
    payload : callable
        Gives the model's shared payload (architecture and compile config).
    elements_of : callable
        ``elements_of(dataset)``: how the model gets that dataset's batches.
    summaries : tuple
        The ``TrainSummary`` and ``ValidationSummary`` to write, or None.
    """

    def __init__(self, model: Any, dataset: Any, settings: RunSettings, state: RunState, clipping: GradientClipping,
                 payload: Callable[[], Any], elements_of: Callable[[Any], MappedElements],
                 summaries: Tuple[Any, Any] = (None, None)):
        self._model = model
        self._dataset = dataset
        self._settings = settings
        self._state = state
        self._clipping = clipping
        self._payload = payload
        self._elements_of = elements_of
        self._train_summary, self._val_summary = summaries

    def run(self, request: RunRequest) -> Tuple[Dict[str, Any], Any]:
        """Train until ``request.end_trigger`` fires (or a callback stops training).

        Returns
        -------
        tuple
            ``optimize``'s result dict and the call's ``keras.callbacks.History``.
        """
        import keras

        settings, validation = self._settings, self._dataset.val_dataset
        check_trainable(settings.tables.plan, self._model, self._clipping.clip_norm)
        checkpoints = CheckpointWriter(settings.model_dir, settings.keep_checkpoints, request.checkpoint_trigger,
                                       request.checkpoint_failures)
        stops = [request.end_trigger]
        stops += [request.checkpoint_trigger] if settings.model_dir else []
        stops += [request.validation_trigger] if validation is not None else []
        stops += [EveryEpoch()] if request.callbacks else []  # callbacks see the model at every epoch end
        keras_history = keras.callbacks.History()
        driver = self._driver_callbacks(request, keras_history)
        history: Dict[str, Any] = {"loss": []}
        anatomy = CallAnatomy(driver.straggler)
        with call_scope(settings.session, "optimize") as call, \
                WorkerInputs(self._dataset, settings.collective_timeout + watchdog_slack(settings.session)) as inputs:
            runner = self._runner(call, inputs)
            runner.start(self._state.iteration)  # too few task slots: fails before any job
            progress = self._progress()
            driver.train_begin()
            while not request.end_trigger(progress):
                driver.segment_begins(progress)
                first = progress.iteration + 1
                result = self._run_segment(runner, progress, TriggerOr(*stops), driver, request, anatomy.watch)
                anatomy.add(result.anatomy)
                progress = self._finish_segment(result, history)
                checkpoints.after_segment(progress, self._capture)
                settings.tables.prune(self._state.optimizer_state_folder, settings.model_dir)
                results = None
                epoch_end = bool(request.callbacks) and progress.epoch_finished
                if validation is not None and (request.validation_trigger(progress) or epoch_end):
                    progress, results = self._validate(validation, progress, history)
                if driver.segment_ends(first, result.losses, result.step_seconds, progress, results, result.workers,
                                       result.metrics):
                    break
            checkpoints.finish(self._capture)
            self._keep_anatomy(anatomy, request)
            driver.train_end()
        history["iterations"] = self._state.iteration
        history["epochs"] = progress.epoch
        return history, keras_history

    def _keep_anatomy(self, anatomy: CallAnatomy, request: RunRequest) -> None:
        """The call's rank timings and stragglers, and its timeline when ``profile_steps`` asked for one."""
        state = self._state
        state.rank_timings, state.stragglers = anatomy.rank_timings(), anatomy.stragglers()
        if request.profile_steps is not None:
            folder = self._local_model_dir() or tempfile.mkdtemp(prefix="sparktf-timeline-")
            state.last_timeline = anatomy.write_timeline(folder, request.profile_steps)

    def _local_model_dir(self) -> Optional[str]:
        """``model_dir`` when it is a local folder (None: none, or an object store's)."""
        model_dir = self._settings.model_dir
        return model_dir if model_dir and "://" not in model_dir else None

    def _runner(self, call: Any, inputs: WorkerInputs) -> SegmentRunner:
        """The segments' launcher: the call holds the slots, so concurrent calls wait their turn."""
        settings = self._settings
        profile = settings.resource_profile
        membership = Membership(settings.session, settings.num_workers, settings.min_workers, settings.replace_wait,
                                inputs.prepare, probe=lambda: call.slots(profile), busy_wait=call.busy_wait,
                                available=lambda: min(call.slots(profile).free, call.grantable(profile)))
        local = self._local_model_dir()
        return SegmentRunner(settings.session, inputs, membership, settings.max_failures, profile, call,
                             stacks_folder=None if local is None else os.path.join(local, "stacks"))

    def _driver_callbacks(self, request: RunRequest, history: Any) -> DriverCallbacks:
        """The callbacks, the progress display (if any) and ``history``, labelled in threads beside others."""
        settings = self._settings
        end = request.end_trigger
        elastic = settings.num_workers if settings.min_workers < settings.num_workers else None
        return DriverCallbacks(list(request.callbacks), self._model, verbose=request.verbose,
                               iterations_per_epoch=self._per_epoch(), global_batch=self._dataset.batch_size,
                               epochs=end.n if isinstance(end, MaxEpoch) else None, history=history,
                               num_workers=elastic, label=current_label())

    def _capture(self) -> ModelState:
        state = self._settings.tables.capture(self._model, self._state.iteration, self._state.optimizer_state_folder)
        state.stream, state.publish_due = self._state.stream, self._state.publish_due
        return state

    def _per_epoch(self) -> int:
        return self._dataset.iterations_per_epoch(self._settings.num_workers)

    def _progress(self) -> TrainingProgress:
        state = self._state
        return TrainingProgress(state.iteration, self._per_epoch(), state.last_loss, state.last_score)

    def _run_segment(self, runner: SegmentRunner, progress: TrainingProgress, stop: Trigger, driver: DriverCallbacks,
                     request: RunRequest, watch_steps: Callable[[Dict[int, Any]], None]) -> SegmentResult:
        """One segment from the driver's state (relaunched from it after a failure, maybe on fewer workers), its
        tables as the strategy holds them for ``num_workers`` (the launch plans them again for its own); the ranks'
        reports go to the progress display and to ``watch_steps``."""
        settings = self._settings
        elements = self._elements_of(self._dataset)
        structure = model_structure(self._model, elements.element)  # sparse or dense per model input
        spec = SegmentSpec(self._payload(), structure, progress, stop, self._clipping, settings.collective_timeout,
                           maps=elements, gradient_compression=settings.gradient_compression,
                           gpus=gpu_plan(settings.session.conf, settings.resource_profile),
                           metric_state=self._state.metric_state, class_weight=request.class_weight,
                           tables=settings.tables.for_workers(),
                           schedule=request.schedule,
                           profile_steps=request.profile_steps)
        def on_reports(reports: Dict[int, Any]) -> None:
            driver.report(reports)
            watch_steps(reports)

        return runner.run(spec, self._capture, on_reports, lambda workers: driver.launching(workers, progress.iteration))

    def _finish_segment(self, result: SegmentResult, history: Dict[str, Any]) -> TrainingProgress:
        """Take the segment's state into the driver's model; log its iterations and the epochs it ended."""
        state = self._state
        result.state.apply_to(self._model)
        state.optimizer_state_folder = result.state.optimizer_state_folder
        first = state.iteration + 1
        state.iteration, state.last_timings, state.last_traffic = result.iteration, result.timings, result.traffic
        state.metric_state = result.metric_state
        last = record_segment(result, first, self._per_epoch(), self._dataset.batch_size, history,
                              self._train_summary, state.last_score)
        state.last_loss = state.last_loss if last is None else last
        return self._progress()

    def _validate(self, validation: Any, progress: TrainingProgress,
                  history: Dict[str, Any]) -> Tuple[TrainingProgress, Dict[str, float]]:
        settings = self._settings
        try:
            batch = validation.inference_batch_size(settings.num_workers)
        except DataError:
            batch = self._dataset.local_batch_size(settings.num_workers)
        results = evaluate_model(self._model, validation, self._elements_of(validation), batch, self._payload(),
                                 self._state.iteration, settings.collective_timeout, settings.resource_profile,
                                 tables=settings.tables.plan)
        self._state.last_score = record_validation(results, progress, history, self._val_summary)
        return self._progress(), results


def evaluate_model(model: Any, dataset: Any, elements: MappedElements, batch: int, payload: Any, iteration: int,
                   collective_timeout: float, profile: Any, blocks: Any = None,
                   tables: Optional[ShardPlan] = None) -> Dict[str, float]:
    """The driver model's compiled loss and metrics over every record of ``dataset``, with its current weights.

    Parameters
    ----------
    model : keras.Model
        The driver's compiled model.
    dataset : TFDataset
        The data.
    elements : MappedElements
        How the model gets the dataset's batches.
    batch : int
        Records per batch in each partition.
    payload : Broadcast-like
        The model's shared payload.
    iteration : int
        The iteration the weights are of.
    collective_timeout : float
        Seconds before a task that makes no progress is cancelled (plus the watchdog's slack).
    profile : ResourceProfile or None
        What each task needs.
    blocks : BlockSet, optional
        The dataset's records as other Blocks (e.g. its training layout); default ``dataset.blocks``.
    tables : ShardPlan, optional
        The model's sharded tables: the tasks fetch a batch's rows of them by id, never a whole table.
    """
    state = ModelState.capture(model, iteration, include_optimizer=False)
    return evaluate_blocks(model, dataset.blocks if blocks is None else blocks, elements, batch, payload, state,
                           collective_timeout, profile, tables)
