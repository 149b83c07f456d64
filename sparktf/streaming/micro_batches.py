"""One ``foreachBatch`` call of ``optimize_stream``: skip, test, train one pass, commit, publish, report.

Exactly once rests on one order of writes. Spark writes a micro-batch's
offsets before it runs ``foreachBatch`` and its commit after. The model's
checkpoint, written at the end of the micro-batch's training, records the
query's id and the ``batchId`` with the weights and optimizer state, in one
file that is complete or not at all. A restarted query resumes the model
from the newest checkpoint and Spark replays the micro-batch it had not
committed: when the checkpoint already holds that ``batchId``, the call
skips it; otherwise the model is from before it and trains it now.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from sparktf.errors import ConfigurationError, DataError
from sparktf.layers.dynamic_embedding import table_stats
from sparktf.models.published import VersionWriter, newest_version, prune_versions
from sparktf.training.driver import TEST_BATCH_FACTOR
from sparktf.triggers import TrainingProgress

__all__ = ["MicroBatchTrainer", "Publishing", "naming_micro_batch"]

_LOG = logging.getLogger("sparktf.optimizer")
#: Seconds a micro-batch waits for ``start()`` to hand over the query's id.
_QUERY_ID_WAIT = 120.0


@contextlib.contextmanager
def naming_micro_batch(batch_id: int, frame: Any) -> Iterator[None]:
    """A ``DataError`` raised inside names the micro-batch (Spark's ``batchId``) before what it says, and the file
    its bad record came from when Spark tells it (a file source: ``input_file_name``)."""
    try:
        yield
    except DataError as error:
        if error.args and not str(error.args[0]).startswith("micro-batch "):
            found = None if error.bad_row is None else _file_of(frame, *error.bad_row)
            where = f"micro-batch {batch_id}" + ("" if found is None else f", file {found}")
            error.args = (f"{where}: {error.args[0]}",) + tuple(error.args[1:])
        raise


def _file_of(frame: Any, partition: int, row: int) -> Optional[str]:
    """The file row ``row`` of ``frame``'s partition ``partition`` was read from (None: not from a file, or Spark
    could not say). One small job, on the failure's road only."""
    from pyspark.sql import functions

    position = functions.monotonically_increasing_id()  # the partition in its upper 31 bits, the row below
    try:
        found = (frame.select(functions.input_file_name().alias("file"), position.alias("position"))
                 .where(functions.col("position") == (partition << 33) + row).limit(1).collect())
    except Exception as error:  # the error being raised matters more than where it came from
        _LOG.debug("the file of micro-batch row %d of partition %d is unknown: %s", row, partition, error)
        return None
    return found[0]["file"] if found and found[0]["file"] else None


@dataclass(frozen=True)
class Publishing:
    """When ``optimize_stream`` publishes versions (see its docstring).

    Attributes
    ----------
    every : int, optional
        A version is due every this many micro-batches trained (None: never).
    full_every : int, optional
        Every this many versions one is full, the others deltas (None: all full).
    gate : callable, optional
        ``publish_if``: a due version is published only when ``gate(logs)`` is true; else it stays due.
    """

    every: Optional[int] = None
    full_every: Optional[int] = None
    gate: Optional[Callable[[Dict[str, Any]], bool]] = None


class MicroBatchTrainer:
    """The ``foreachBatch`` function of ``optimize_stream``: trains each micro-batch once.

    Parameters
    ----------
    optimizer : TFOptimizer
        With a streaming dataset and ``model_dir``.
    publishing : Publishing
        When versions are published.
    callbacks : list of keras.callbacks.Callback
        Told of every micro-batch (``on_epoch_begin`` / ``on_epoch_end``).
    """

    def __init__(self, optimizer: Any, publishing: Publishing, callbacks: Sequence[Any]):
        self._optimizer = optimizer
        self._publishing = publishing
        self._versions = VersionWriter(optimizer.model_dir, publishing.full_every)
        self._callbacks = list(callbacks)
        self._session = optimizer.training_session
        self._elements = self._session.elements_of(optimizer.dataset)  # one trace for every micro-batch
        self._query_id: Optional[str] = None
        self._started = threading.Event()
        self.progress: List[Dict[str, Any]] = []
        self._refused: Dict[str, int] = {}  # each dynamic table's refused admissions at the last entry

    @property
    def error(self) -> Optional[BaseException]:
        """What stopped training beside the query (None: nothing; each micro-batch trains inside its call here)."""
        return None

    def prepare(self) -> None:
        """Before the query starts: start what trains beside it (nothing, here)."""

    def finish(self) -> None:
        """After the query ended: train what it handed over and did not train yet (nothing, here)."""

    def stop(self) -> None:
        """The query is stopping: stop training (nothing runs beside the query, here)."""

    def started(self, query_id: str) -> None:
        """The query started: its id marks what the checkpoints record. A version the checkpoint's micro-batch was
        due and did not get (a driver that died while publishing it) is published now."""
        self._query_id = query_id
        self._publish_missed()
        self._resume()
        self._started.set()

    def _resume(self) -> None:
        """Before the first micro-batch: take up what a previous run of the query left (nothing, here)."""

    def _publish_missed(self) -> None:
        """Publish the checkpointed model when its micro-batch was due a version and none of it exists."""
        state, every = self._session.state, self._publishing.every
        if not every or state.stream is None or state.publish_due < every or state.stream[0] != self._query_id:
            return
        newest = newest_version(self._optimizer.model_dir)
        if newest is not None and (newest.manifest.get("queryId"), newest.manifest.get("batchId")) == state.stream:
            state.publish_due = 0  # published: its manifest was written, the next checkpoint was not
        elif self._publishing.gate is None:  # a gate needs the micro-batch's metrics, gone with the driver
            _LOG.info("micro-batch %d was due a version and has none (the driver stopped while publishing it): "
                      "publishing it now", state.stream[1])
            self._write_version(state.stream[1], {})

    def _trained_already(self, batch_id: int) -> bool:
        """Wait for the query's id; whether the model's checkpoint holds micro-batch ``batch_id`` of this query."""
        if not self._started.wait(_QUERY_ID_WAIT):
            raise ConfigurationError(f"micro-batch {batch_id} did not learn its query's id within "
                                     f"{_QUERY_ID_WAIT:.0f} s of its start; restart the query")
        done = self._session.state.stream
        if done is not None and done[0] == self._query_id and batch_id <= done[1]:
            _LOG.info("micro-batch %d of query %s is in the model's checkpoint already (trained before the query "
                      "committed it): skipped", batch_id, self._query_id)
            return True
        return False

    def __call__(self, batch: Any, batch_id: int) -> None:
        batch_id = int(batch_id)
        if not self._trained_already(batch_id):
            with naming_micro_batch(batch_id, batch):
                self._train_micro_batch(batch, batch_id)

    def _train_micro_batch(self, batch: Any, batch_id: int) -> None:
        optimizer = self._optimizer
        dataset = optimizer.dataset.micro_batch(batch)
        records = dataset.num_records
        if records == 0:
            return
        began = time.time()
        for callback in self._callbacks:
            callback.on_epoch_begin(batch_id)
        workers = min(optimizer.num_workers, records)
        layout = dataset.training_blocks(workers)  # laid out once: the test job computes it, training reads it
        cached_here = not layout.is_cached
        if cached_here:
            layout.persist("micro-batch")
        try:
            tested = self._test(dataset, layout, workers)
            losses = self._train(dataset, workers, batch_id)
        finally:
            if cached_here:
                layout.unpersist()
        self._record(batch_id, began, losses, tested, records)

    def _record(self, batch_id: int, began: float, losses: Sequence[float], tested: Dict[str, float],
                records: int, **more: Any) -> None:
        """A trained micro-batch: its progress entry (with ``more``), version (when one is due), summaries and
        callbacks."""
        logs: Dict[str, Any] = {"loss": float(sum(losses) / len(losses)) if len(losses) else float("nan"),
                                **{f"test_{name}": float(value) for name, value in tested.items()},
                                "records": records}
        ended = time.time()
        entry = {"batchId": batch_id, "iteration": self._optimizer.iteration, "started": began, "ended": ended,
                 "seconds": ended - began, **logs, **more}
        tables = table_stats(self._optimizer.model)
        if tables:
            entry["dynamic_tables"] = tables
            self._warn_refused(batch_id, tables)
        entry.update(self._publish(batch_id, logs))
        self.progress.append(entry)
        self._summarize(tested, tables)
        for callback in self._callbacks:
            callback.on_epoch_end(batch_id, dict(logs))

    def _test(self, dataset: Any, layout: Any, workers: int) -> Dict[str, float]:
        """The compiled loss and metrics over the micro-batch (its training ``layout``: one task a worker) with the
        model before it trains on it."""
        optimizer = self._optimizer
        batch = TEST_BATCH_FACTOR * dataset.local_batch_size(workers)  # forward only: no gradients to hold
        return self._session.evaluate(dataset, batch, optimizer.collective_timeout, optimizer.resource_profile,
                                      layout, self._elements)

    def _train(self, dataset: Any, workers: int, batch_id: int) -> List[float]:
        """One pass over the micro-batch; its checkpoint records ``batch_id`` and the publishing cadence. The
        per-iteration losses."""
        optimizer = self._optimizer
        return self._session.train_pass(dataset, optimizer.run_settings(workers), optimizer.clipping,
                                        (self._query_id, batch_id), self._elements, self._session.state.publish_due + 1)

    def _publish(self, batch_id: int, logs: Dict[str, Any]) -> Dict[str, Any]:
        """Publish the model when ``publish_every`` micro-batches were trained since the last version and
        ``publish_if`` agrees; what the progress entry says of it (``version``, or ``publish_refused``)."""
        publishing = self._publishing
        if not publishing.every or self._session.state.publish_due < publishing.every:
            return {}
        if publishing.gate is not None and not publishing.gate(dict(logs)):
            _LOG.info("micro-batch %d: publish_if refused a version (metrics %s); it stays due", batch_id, logs)
            return {"publish_refused": True}
        return {"version": self._write_version(batch_id, logs)}

    def _write_version(self, batch_id: int, logs: Dict[str, Any]) -> int:
        """Publish the model as it stands for micro-batch ``batch_id``; the version's number."""
        optimizer = self._optimizer
        manifest = {"batchId": batch_id, "queryId": self._query_id, "iteration": optimizer.iteration,
                    "time": time.time(), "metrics": {k: v for k, v in logs.items() if k != "records"}}
        version = self._versions.write(optimizer.model, manifest)
        prune_versions(optimizer.model_dir, optimizer.keep_checkpoints)
        self._session.state.publish_due = 0  # the next checkpoint counts from here
        _LOG.info("published version %d (micro-batch %d) to %s", version.version, batch_id, version.path)
        return version.version

    def _warn_refused(self, batch_id: int, tables: Dict[str, Dict[str, int]]) -> None:
        """Say when a dynamic table refused ids for want of room in the micro-batch (they read fallback rows)."""
        for name, stats in tables.items():
            refused = stats["refused_full"] - self._refused.get(name, 0)
            self._refused[name] = stats["refused_full"]
            if refused > 0:
                _LOG.warning("micro-batch %d: the DynamicEmbedding %r is full (%d of %d rows) and refused %d admissions: "
                             "those ids read its fallback rows. Raise its capacity, or evict (evict={'ttl_steps': N} or "
                             "{'lfu': decay})", batch_id, name, stats["rows"], stats["capacity"], refused)

    def _summarize(self, tested: Dict[str, float], tables: Dict[str, Dict[str, int]]) -> None:
        """The test-then-train metrics and the dynamic tables' counts to the train summary, at the iteration the
        micro-batch ended."""
        summary = self._optimizer.train_summary
        if summary is None:
            return
        progress = TrainingProgress(self._optimizer.iteration, 1, None, None)
        for name, value in tested.items():
            summary.add_scalar(f"Test{name[:1].upper()}{name[1:]}", float(value), progress)
        for layer, stats in tables.items():
            for name in ("rows", "fallback_reads", "refused_full", "evicted"):
                summary.add_scalar(f"DynamicTables/{layer}/{name}", float(stats[name]), progress)
        summary.flush()
