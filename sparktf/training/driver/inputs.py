"""The training data of one ``optimize`` call, laid out for each worker count it uses.

``dataset.training_input(n)`` gives the Blocks a training job maps over (one
partition per worker: a Spark shuffle when the dataset's partitions are not
already like that, persisted while its context lasts) and the feed that
batches them. When elastic training changes the worker count, each count needs
its own layout. :class:`WorkerInputs` opens one per count on first use, keeps
them all for the call and closes them (unpersisting everything they persisted)
at its end. :meth:`WorkerInputs.prepare` computes a layout ahead of its first
launch, in a background job that fills Spark's cache, so that the driver's
wait for lost executors and the shuffle overlap.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from sparktf.spark.jobs import jvm_gone, run_job

__all__ = ["WorkerInputs"]

_LOG = logging.getLogger("sparktf.optimizer")
#: Seconds :meth:`WorkerInputs.close` waits for a cancelled background job to end.
_CANCEL_WAIT = 30.0


class WorkerInputs:
    """Per worker count, ``(blocks, feed)`` and the local batches of one ``optimize`` call (a context manager).

    Parameters
    ----------
    dataset : TFDataset
        The training data.
    build_timeout : float
        Seconds a launch waits for the background job that lays out its
        count's data; past that the job is cancelled and the training job
        computes the data itself.
    """

    def __init__(self, dataset: Any, build_timeout: float):
        self._dataset = dataset
        self._build_timeout = build_timeout
        self._stack = contextlib.ExitStack()
        self._inputs: Dict[int, Tuple[Any, Any]] = {}
        self._builds: Dict[int, _LayoutBuild] = {}

    def __enter__(self) -> "WorkerInputs":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def get(self, workers: int) -> Tuple[Any, Any]:
        """``(blocks, feed)`` for a job of ``workers`` tasks; background layouts of other counts are cancelled."""
        for count in [count for count in self._builds if count != workers]:
            self._builds.pop(count).cancel()
        build = self._builds.pop(workers, None)
        if build is not None:
            build.finish(self._build_timeout)
        return self._open(workers)

    def local_batches(self, workers: int) -> List[int]:
        """Records each of ``workers`` ranks takes per iteration (they add up to the global batch)."""
        return [self._dataset.local_batch_size(workers, rank) for rank in range(workers)]

    def shard_records(self, workers: int) -> List[int]:
        """Records of each of ``workers`` ranks' shards."""
        bounds = self._dataset.shard_bounds(workers)
        return [end - start for start, end in zip(bounds, bounds[1:])]

    def prepare(self, workers: int) -> None:
        """Start laying out the data for ``workers`` in the background (nothing when it is laid out already)."""
        if workers in self._builds:
            return
        try:
            blocks, _ = self._open(workers)
            if not blocks.is_cached or blocks.fully_cached():
                return
        except Exception as error:  # the launch for this count will raise it properly
            _LOG.warning("could not lay out the training data for %d workers ahead of time: %s", workers, error)
            return
        _LOG.info("laying out the training data for %d workers while waiting", workers)
        self._builds[workers] = _LayoutBuild(blocks, workers)

    def close(self) -> None:
        """Cancel the background layouts and unpersist every training layout opened for the call."""
        builds, self._builds = list(self._builds.values()), {}
        for build in builds:
            build.cancel()
        for build in builds:
            build.join(_CANCEL_WAIT)
        self._inputs = {}
        self._stack.close()

    def _open(self, workers: int) -> Tuple[Any, Any]:
        if workers not in self._inputs:
            self._inputs[workers] = self._stack.enter_context(self._dataset.training_input(workers))
        return self._inputs[workers]


class _LayoutBuild:
    """A Spark job, on its own thread and job tag, computing and caching a persisted training layout."""

    def __init__(self, blocks: Any, workers: int):
        self._blocks = blocks
        self._workers = workers
        self._tag = f"sparktf-layout-{uuid.uuid4().hex[:12]}"
        self.error: Optional[BaseException] = None
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparktf-layout", daemon=True)
        self._started = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        session = self._blocks.kind
        try:
            session.add_tag(self._tag)
            if self._cancelled.is_set():
                return
            run_job(session, self._blocks.compute, what=f"laying out the training data for {self._workers} workers")
        except Exception as error:  # cancelled, or failed: the training job computes the data itself
            self.error = error
        finally:
            try:
                session.remove_tag(self._tag)
            except Exception as error:
                if not jvm_gone(error):
                    _LOG.warning("could not remove the job tag %s: %s", self._tag, error)

    def finish(self, timeout: float) -> None:
        """Wait for the job (at most ``timeout`` seconds, then cancel it: the training job computes the rest)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            _LOG.warning("laying out the training data for %d workers took more than %.0f s; the training job "
                         "goes on without waiting for it", self._workers, timeout)
            self.cancel()
        elif self.error is None:
            _LOG.info("laid out the training data for %d workers in %.1f s", self._workers,
                      time.monotonic() - self._started)

    def cancel(self) -> None:
        self._cancelled.set()
        if not self._thread.is_alive():
            return
        try:
            self._blocks.kind.cancel_tag(self._tag)
        except Exception as error:
            if not jvm_gone(error):
                _LOG.warning("could not cancel laying out the training data for %d workers: %s",
                             self._workers, error)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
