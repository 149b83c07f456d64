"""One Spark job served by the driver: a fresh secret, a job channel serving the state, the watchdog over the job.

Training segments, evaluation jobs and a stream's resident job all run the
same way: :func:`served_job` makes the job's secret and, on the driver's
address, a :class:`~sparktf.collective.JobChannel` serving the model state
to the tasks (or none, to go through Spark); :meth:`ServedJob.run` starts
the job under a :class:`~sparktf.training.driver.watchdog.JobWatchdog`
when there is a channel, else as a plain action with its failures made
readable (:func:`~sparktf.spark.jobs.run_job`).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, TypeVar

from sparktf.collective import JobChannel
from sparktf.spark.jobs import run_job
from sparktf.training.checkpoint import ModelState
from sparktf.training.driver.watchdog import JobWatchdog

__all__ = ["ServedJob", "served_job", "job_channel"]

_LOG = logging.getLogger("sparktf.optimizer")
T = TypeVar("T")


@dataclass(frozen=True)
class ServedJob:
    """A job's secret and channel (None: the job goes through Spark: ``spark.sparktf.rendezvous=barrier``, or an
    address the driver cannot listen on).

    Attributes
    ----------
    session : SessionKind
        The session that runs the job.
    tasks : int
        The job's tasks (ranks, or partitions).
    secret : bytes
        The job's secret.
    channel : JobChannel, optional
        The job's channel, serving the state.
    """

    session: Any
    tasks: int
    secret: bytes
    channel: Optional[JobChannel]

    @property
    def address(self) -> Optional[str]:
        """``"host:port"`` of the channel (None without one)."""
        return None if self.channel is None else self.channel.address

    def run(self, action: Callable[[], T], what: str, timeout: float, barrier: bool = True,
            on_reports: Optional[Callable[[dict], None]] = None, stacks_folder: Optional[str] = None) -> T:
        """Run ``action`` (it starts the job): under the watchdog (see :meth:`JobWatchdog.run`) with a channel,
        else as :func:`~sparktf.spark.jobs.run_job` does."""
        if self.channel is None:
            return run_job(self.session, action, what=what)
        watchdog = JobWatchdog(self.session, self.channel, self.tasks, timeout, on_reports, barrier=barrier,
                               stacks_folder=stacks_folder)
        return watchdog.run(action, what)


@contextlib.contextmanager
def served_job(session: Any, tasks: int, state: Optional[ModelState], with_channel: bool = True
               ) -> Iterator[ServedJob]:
    """A job of ``tasks`` tasks with its secret and (``with_channel``), on the session's rendezvous address, a
    channel serving ``state`` (if any) for as long as the block runs."""
    secret = secrets.token_bytes(32)
    with job_channel(session.rendezvous_host() if with_channel else None, tasks, secret) as channel:
        if channel is not None and state is not None:
            channel.serve_state(*state.to_wire())
        yield ServedJob(session, tasks, secret, channel)


@contextlib.contextmanager
def job_channel(host: Optional[str], num_workers: int, secret: bytes) -> Iterator[Optional[JobChannel]]:
    """A job channel on ``host`` for one barrier job, or None to go through Spark instead.

    None for ``host=None`` (``spark.sparktf.rendezvous=barrier``) and, with a
    warning, when ``host`` cannot be listened on (e.g. a ``spark.driver.host``
    that names a proxy or service address; a Spark Connect session checked it
    already, see ``SessionKind.rendezvous_host``).
    """
    if host is None:
        yield None
        return
    try:
        channel = JobChannel(num_workers, secret, host)
    except OSError as error:
        _LOG.warning(
            "cannot listen on spark.driver.host=%s for the job channel (%s); the workers exchange "
            "addresses through BarrierTaskContext.allGather and the model state travels through "
            "the JVM instead",
            host, error,
        )
        yield None
        return
    with channel:
        yield channel
