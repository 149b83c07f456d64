"""``optimize_stream``'s query: its settings checked before any job, the model resumed, ``foreachBatch`` started."""

from __future__ import annotations

import logging
import numbers
from typing import Any, Callable, Dict, List, Optional, Sequence

from pyspark.sql.streaming import StreamingQuery

from sparktf.errors import ConfigurationError
from sparktf.storage import join, store_for
from sparktf.streaming.micro_batches import MicroBatchTrainer, Publishing
from sparktf.training.driver import latest_checkpoint

__all__ = ["TrainingQuery", "start_training_query", "check_trigger"]

_LOG = logging.getLogger("sparktf.optimizer")

#: ``DataStreamWriter.trigger``'s keywords that ``foreachBatch`` runs with (continuous processing has no batches).
_TRIGGERS = ("processingTime", "once", "availableNow")


class TrainingQuery(StreamingQuery):
    """The running query of ``optimize_stream``: a ``StreamingQuery`` that also tells what each micro-batch trained.

    It holds the query ``DataStreamWriter.start`` returned and delegates to
    it; waiting for it and stopping it also wait for and stop what trains
    beside it (a resident training job).

    Attributes
    ----------
    training_progress : list of dict
        One entry per micro-batch trained by this query run: ``batchId``,
        ``iteration``, ``records``, ``loss`` (the mean over its iterations),
        ``test_loss`` and ``test_<metric>`` (before training on it),
        ``started`` and ``ended`` (epoch seconds), ``seconds`` and, when one
        was published, ``version``.
    """

    def __init__(self, query: StreamingQuery, trainer: MicroBatchTrainer):  # no super(): the query is held
        self._query = query
        self._trainer = trainer

    @property
    def id(self) -> str:
        return self._query.id

    @property
    def runId(self) -> str:
        return self._query.runId

    @property
    def name(self) -> str:
        return self._query.name

    @property
    def isActive(self) -> bool:
        return self._query.isActive

    @property
    def status(self) -> Dict[str, Any]:
        return self._query.status

    @property
    def recentProgress(self) -> List[Dict[str, Any]]:
        return self._query.recentProgress

    @property
    def lastProgress(self) -> Optional[Dict[str, Any]]:
        return self._query.lastProgress

    def processAllAvailable(self) -> None:
        return self._query.processAllAvailable()

    def explain(self, extended: bool = False) -> None:
        return self._query.explain(extended)

    def awaitTermination(self, timeout: Optional[int] = None) -> Optional[bool]:
        """Wait for the query to end (as ``StreamingQuery``'s), then for the micro-batches it staged to train.

        Raises
        ------
        StreamingQueryException
            The query failed (a ``foreachBatch`` call raised).
        SparkTFError
            The resident training job failed (its error, naming the micro-batch).
        """
        try:
            ended = self._query.awaitTermination(timeout)
        except BaseException:
            self._trainer.stop()
            raise
        if ended is None or ended:
            self._trainer.finish()
        return ended

    def stop(self) -> None:
        """Stop the query; a resident training job ends after the micro-batch it trains, its checkpoint written
        (the micro-batches staged after it train when the query starts again)."""
        self._query.stop()
        self._trainer.stop()

    def exception(self) -> Any:
        """The query's exception, else the resident training job's error, else None."""
        return self._query.exception() or self._trainer.error

    @property
    def training_progress(self) -> List[Dict[str, Any]]:
        return list(self._trainer.progress)

    @property
    def last_training_progress(self) -> Optional[Dict[str, Any]]:
        """The last entry of :attr:`training_progress` (None before any)."""
        progress = self._trainer.progress
        return dict(progress[-1]) if progress else None


def check_trigger(trigger: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """``trigger`` as ``DataStreamWriter.trigger`` keywords; a ``ConfigurationError`` naming what Spark would not run."""
    if trigger is None:
        return {}
    if not isinstance(trigger, dict) or len(trigger) != 1:
        raise ConfigurationError(
            f"trigger must be a dict of one DataStreamWriter.trigger keyword, e.g. {{'processingTime': '2 seconds'}} "
            f"or {{'availableNow': True}}; got {trigger!r}")
    (key, value), = trigger.items()
    if key == "continuous":
        raise ConfigurationError("trigger {'continuous': ...} runs no micro-batches, and optimize_stream trains "
                                 f"micro-batches: use one of {list(_TRIGGERS)}")
    if key not in _TRIGGERS:
        raise ConfigurationError(f"trigger keyword {key!r} is not one Spark knows; use one of {list(_TRIGGERS)}")
    if key == "processingTime" and not (isinstance(value, str) and value.strip()):
        raise ConfigurationError(f"trigger processingTime takes an interval string such as '2 seconds', got {value!r}")
    if key != "processingTime" and value is not True:
        raise ConfigurationError(f"trigger {key!r} takes True, got {value!r}")
    return {key: value}


def _check_same_query(optimizer: Any, location: str) -> None:
    """Refuse a query at ``location`` other than the one whose micro-batches the model's checkpoint holds: its
    micro-batches would all train again."""
    trained = optimizer.training_session.state.stream
    if trained is None:
        return
    query_id = query_id_at(location)
    if query_id == trained[0]:
        return
    default = join(optimizer.model_dir, "stream")
    where = (f"{default!r}" if location != default and query_id_at(default) == trained[0]
             else "another checkpoint_location")
    raise ConfigurationError(
        f"the model in {optimizer.model_dir!r} trained micro-batches 0-{trained[1]} of query {trained[0]} (at "
        f"{where}), but checkpoint_location {location!r} is "
        f"{'query ' + query_id if query_id else 'a new query'}, whose micro-batches would all train again. Pass the "
        "first query's checkpoint_location to resume it, or optimize_stream(continue_model=True) to train the new "
        "query's records on top of the model")


def query_id_at(location: str) -> Optional[str]:
    """The id of the query whose checkpoint is at ``location`` (Spark's ``metadata`` file), None when none is."""
    import json

    metadata = join(location, "metadata")
    store = store_for(metadata, "checkpoint_location")
    if not store.exists(metadata):
        return None
    return json.loads(store.read_bytes(metadata).decode("utf-8").splitlines()[0]).get("id")


def _positive_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and value >= 1 and not isinstance(value, bool)


def _trainer(optimizer: Any, publishing: Publishing, callbacks: Sequence[Any], max_staged: int,
             resident: Optional[bool]) -> MicroBatchTrainer:
    """A resident training job's trainer when the session has a task slot beside the training workers for the
    stream's own jobs (and nothing else rules it out) and ``resident`` is not False; else the per-micro-batch one,
    said once in the log (``resident=True`` raises instead)."""
    from sparktf.streaming.resident import ResidentTrainer

    workers = optimizer.num_workers
    slots = optimizer.session.slots(optimizer.resource_profile).total
    reason = None
    if resident is False:
        reason = "resident=False"
    elif slots < workers + 1:
        reason = (f"the session's {slots} task slots leave none beside the {workers} training workers for the "
                  f"stream's own jobs (a resident job needs {workers + 1}; use fewer workers or more slots)")
    elif optimizer.training_session.tables.plan.tables:
        reason = "the model has sharded tables, which the resident job does not train yet"
    elif optimizer.session.rendezvous_host() is None:
        reason = "spark.sparktf.rendezvous=barrier: the resident job takes its orders through the job channel"
    if reason is None:
        _LOG.info("optimize_stream trains in a resident job of %d workers (%d task slots in all)", workers, slots)
        return ResidentTrainer(optimizer, publishing, callbacks, max_staged)
    if resident:
        raise ConfigurationError(f"optimize_stream(resident=True) cannot keep a training job resident: {reason}")
    _LOG.info("optimize_stream trains each micro-batch with jobs of its own: %s", reason)
    return MicroBatchTrainer(optimizer, publishing, callbacks)


def start_training_query(optimizer: Any, *, trigger: Optional[Dict[str, Any]], publish_every: Optional[int],
                         checkpoint_location: Optional[str], callbacks: Sequence[Any], max_staged: int = 2,
                         publish_if: Optional[Callable[[Dict[str, Any]], bool]] = None,
                         full_every: Optional[int] = None, resident: Optional[bool] = None,
                         continue_model: bool = False) -> TrainingQuery:
    """Check ``optimize_stream``'s settings (its keywords), resume the model from ``model_dir`` and start the query.

    Raises
    ------
    ConfigurationError
        A dataset that is not streaming, no ``model_dir``, a trigger Spark does
        not know, a bad ``publish_every``, a Spark Connect session, or (without
        ``continue_model``) a ``checkpoint_location`` of another query than the
        one the model's checkpoint trained.
    """
    dataset = optimizer.dataset
    if not dataset.is_streaming:
        raise ConfigurationError("optimize_stream trains on a stream, but this TFOptimizer's dataset is a batch one: "
                                 "make it with TFDataset.from_dataframe(spark.readStream...) or call optimize()")
    if not optimizer.model_dir:
        raise ConfigurationError("optimize_stream needs model_dir: its checkpoints record which micro-batches the "
                                 "model has trained (exactly once across restarts). Pass model_dir=... to the "
                                 "TFOptimizer")
    keywords = check_trigger(trigger)
    for name, value, optional in (("publish_every", publish_every, True), ("max_staged", max_staged, False),
                                  ("full_every", full_every, True)):
        if not (_positive_int(value) or (optional and value is None)):
            raise ConfigurationError(f"{name} must be an integer >= 1{' (or None)' if optional else ''}, got {value!r}")
    if resident not in (None, True, False):
        raise ConfigurationError(f"resident must be None (where the slots allow), True or False, got {resident!r}")
    if publish_if is not None and not callable(publish_if):
        raise ConfigurationError(f"publish_if must be a callable of the micro-batch's metrics returning a bool (e.g. "
                                 f"lambda m: m['test_auc'] >= 0.7), got {publish_if!r}")
    if not optimizer.session.has_rdds:
        raise ConfigurationError("optimize_stream needs a classic Spark session: a Spark Connect session runs "
                                 "foreachBatch on the server, away from this model. Score streams from Connect with "
                                 "TFPredictor.predict_dataframe; train where the driver runs the query")
    dataset.local_batch_size(optimizer.num_workers)  # batch_size is set, and fits the workers
    if latest_checkpoint(optimizer.model_dir) is not None:  # where the model stands, committed micro-batches included
        optimizer.load_checkpoint()
    location = checkpoint_location or join(optimizer.model_dir, "stream")
    if not continue_model:
        _check_same_query(optimizer, location)
    trainer = _trainer(optimizer, Publishing(publish_every, full_every, publish_if), callbacks, max_staged, resident)
    for callback in callbacks:
        callback.set_model(optimizer.model)
        callback.on_train_begin()
    writer = dataset.blocks.frame.writeStream.foreachBatch(trainer).option("checkpointLocation", location)
    if keywords:
        writer = writer.trigger(**keywords)
    trainer.prepare()
    try:
        query = writer.start()
    except BaseException:
        trainer.stop()
        raise
    trainer.started(query.id)
    return TrainingQuery(query, trainer)
