"""Driver side of one training segment: the barrier job, its secret and its peer directory.

A segment is one Spark barrier job of ``num_workers`` tasks, each running
:func:`sparktf.training.loop.run_segment`. This module starts it: a fresh
secret for the collective, the driver's peer directory on
``spark.driver.host`` (or ``BarrierTaskContext.allGather`` without one), the
start state broadcast for the job's lifetime, and rank 0's result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from functools import partial
from typing import Any, Iterator, Optional

from sparktf.collective import PeerDirectory
from sparktf.errors import TrainingError
from sparktf.spark.cluster import rendezvous_host
from sparktf.spark.jobs import run_job
from sparktf.training.checkpoint import ModelState
from sparktf.training.loop import SegmentResult, SegmentSpec, run_segment

__all__ = ["run_segment_job", "peer_directory"]

_LOG = logging.getLogger("sparktf.optimizer")


def run_segment_job(sc: Any, blocks: Any, spec: SegmentSpec, state: ModelState, num_workers: int) -> SegmentResult:
    """Run one segment on ``num_workers`` barrier tasks; return rank 0's result.

    Parameters
    ----------
    sc : pyspark.SparkContext
    blocks : pyspark.RDD
        The training Blocks, one partition per worker.
    spec : SegmentSpec
        The segment's settings; its ``state``, ``secret`` and ``directory``
        are filled in here.
    state : ModelState
        The state the workers start from.
    num_workers : int

    Raises
    ------
    SparkTFError
        What the job's tasks raised (see :func:`sparktf.spark.jobs.run_job`).
    """
    secret = secrets.token_bytes(32)
    with peer_directory(rendezvous_host(sc.getConf()), num_workers, secret) as directory:
        state_broadcast = sc.broadcast(state)
        job_spec = dataclasses.replace(spec, state=state_broadcast, secret=secret, directory=directory)
        started = time.perf_counter()
        try:
            results = run_job(
                lambda: blocks.barrier().mapPartitions(partial(run_segment, job_spec)).collect(),
                what=f"the training job after iteration {spec.start.iteration}",
            )
        finally:
            state_broadcast.destroy()
    if len(results) != 1:
        raise TrainingError(f"the training job returned {len(results)} results instead of rank 0's one")
    (result,) = results
    worker_seconds = sum(result.timings.values())
    result.timings["launch"] = time.perf_counter() - started - worker_seconds
    return result


@contextlib.contextmanager
def peer_directory(host: Optional[str], num_workers: int, secret: bytes) -> Iterator[Optional[str]]:
    """The address of a peer directory on ``host`` for one barrier job, or None to use ``allGather``.

    None for one worker, for ``host=None`` (``spark.sparktf.rendezvous=barrier``)
    and, with a warning, when ``host`` cannot be listened on (e.g. a
    ``spark.driver.host`` that names a proxy or service address).
    """
    if num_workers == 1 or host is None:
        yield None
        return
    try:
        directory = PeerDirectory(num_workers, secret, host)
    except OSError as error:
        _LOG.warning(
            "cannot listen on spark.driver.host=%s for the peer directory (%s); the workers "
            "exchange addresses through BarrierTaskContext.allGather instead (~1 s per job)",
            host, error,
        )
        yield None
        return
    with directory:
        yield directory.address
