"""``ConnectSession``: a Spark Connect client session (no SparkContext, no RDDs, no py4j).

Jobs are DataFrame jobs: plain tasks are a ``mapInArrow`` over
``spark.range(n, numPartitions=n)`` (``barrier=True`` for a barrier stage),
and files reach the executors as session artifacts.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
import threading
import uuid
from functools import partial
from typing import Any, Iterable, Iterator, List, Optional

from sparktf.errors import ConfigurationError, SparkTFError
from sparktf.spark.cluster import TaskSlots
from sparktf.spark.resources import describe_profile
from sparktf.spark.session_kind import DRIVER_HOST_CONF, SessionKind, Shared, TaskFunction

__all__ = ["ConnectSession"]

_LOCAL_THREADS = re.compile(r"^local\[(\d+|\*)(?:,\s*\d+)?\]$")
_PARALLELISM_ATTR = "_sparktf_default_parallelism"
_REACHED_ATTR = "_sparktf_reached_hosts"
_RESULT_SCHEMA = "result binary"
#: Seconds a probe task tries to connect to this process; its job is cancelled after REACH_JOB_SECONDS.
REACH_SECONDS = 10.0
REACH_JOB_SECONDS = 120.0


def _reach(host: str, port: int, numbers: Iterable[int]) -> Iterator[bytes]:
    """A probe task: connect to ``host:port`` (this client) and close; b"" on success, else the error."""
    for _ in numbers:
        try:
            with socket.create_connection((host, port), timeout=REACH_SECONDS):
                yield b""
        except OSError as error:
            yield (str(error) or type(error).__name__).encode()


class _ArrowTasks:
    """``mapInArrow`` function running a :data:`TaskFunction` over its partition's numbers."""

    def __init__(self, function: TaskFunction) -> None:
        self.function = function

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        numbers = (number for batch in batches for number in batch.column(0).to_pylist())
        schema = pa.schema([pa.field("result", pa.binary())])
        for value in self.function(numbers):
            yield pa.RecordBatch.from_pydict({"result": [value]}, schema=schema)


class ArtifactBytes(Shared):
    """Bytes shipped as a session artifact (``addArtifacts(file=True)``), read with ``SparkFiles`` on executors."""

    def __init__(self, file_name: str) -> None:
        self.file_name = file_name

    @property
    def value(self) -> bytes:
        from pyspark import SparkFiles

        with open(SparkFiles.get(self.file_name), "rb") as shipped:
            return shipped.read()


class ConnectSession(SessionKind):
    """A Spark Connect session: settings through ``spark.conf``, jobs over DataFrames."""

    name = "Spark Connect"
    has_rdds = False
    #: The server's executors registered before its clients came, and its slots are read once per session.
    executor_wait = 0.0

    @property
    def conf(self) -> Any:
        return self.session.conf

    def default_parallelism(self) -> int:
        """The server's ``defaultParallelism``: ``spark.range``'s partitions (a one-row job, once per session)."""
        known = getattr(self.session, _PARALLELISM_ATTR, None)
        if known is None:
            from pyspark.sql import functions as F

            probe = self.session.range(1 << 20).select(F.spark_partition_id().alias("p")).agg(F.max("p"))
            known = int(probe.collect()[0][0]) + 1
            setattr(self.session, _PARALLELISM_ATTR, known)
        return known

    def default_fs(self) -> str:
        return self.conf.get("spark.hadoop.fs.defaultFS", None) or "file:///"

    def task_slots(self) -> int:
        """``local[N]``'s N; on a cluster the default parallelism (its cores) over ``spark.task.cpus``."""
        return self.slots().total

    def slots(self, profile: Any = None) -> TaskSlots:
        """Total slots as :meth:`task_slots` (a profile's ``cpus`` instead of ``spark.task.cpus``); busy ones unknown."""
        local = _LOCAL_THREADS.match(self.master)
        if local and local.group(1) != "*":
            return TaskSlots(int(local.group(1)), {})
        cpus = float(self.conf.get("spark.task.cpus", "1") or 1)
        if profile is not None and "cpus" in profile.taskResources:
            cpus = float(profile.taskResources["cpus"].amount)
        total = max(1, int(self.default_parallelism() // max(cpus, 1)))
        return TaskSlots(total, {}, describe_profile(profile) if profile is not None else "")

    def rendezvous_host(self) -> str:
        """The job channel's checked address (:meth:`driver_host`): a Connect job has no other way to the model state.

        Raises
        ------
        ConfigurationError
            For ``spark.sparktf.rendezvous=barrier``, or an address this machine does not have.
        """
        host = super().rendezvous_host()
        if host is None:
            raise ConfigurationError(
                "spark.sparktf.rendezvous=barrier needs a classic session: in Spark Connect the tasks get the "
                "model state from sparktf's job channel in this process. Unset it, and set "
                "spark.sparktf.driverHost to an address of this machine that the executors reach"
            )
        self._check_reachable(host)
        return host

    def _check_reachable(self, host: str) -> None:
        """Once per session and address: one task connects to a listener here, so a blocked client fails in seconds.

        Raises
        ------
        ConfigurationError
            The task could not connect within :data:`REACH_SECONDS`, naming
            ``spark.sparktf.driverHost``.
        """
        reached = getattr(self.session, _REACHED_ATTR, set())
        if host in reached:
            return
        tag = f"sparktf-reach-{uuid.uuid4().hex[:12]}"
        timer = threading.Timer(REACH_JOB_SECONDS, self.cancel_tag, (tag,))
        timer.daemon = True
        with socket.create_server((host, 0)) as listener:
            port = listener.getsockname()[1]
            timer.start()
            try:
                (error,) = self.run_tasks(1, partial(_reach, host, port), tag)
            except Exception as failure:
                raise SparkTFError(f"checking that the executors reach this process at {host}:{port} failed "
                                   f"(within {REACH_JOB_SECONDS:g} s): {failure}") from failure
            finally:
                timer.cancel()
        if error:
            raise ConfigurationError(
                f"the executors cannot reach this process at {host}:{port} ({error.decode()}): sparktf's tasks "
                f"connect to it for the model state and their progress. Set {DRIVER_HOST_CONF} to an address "
                "of this machine that the executors can reach, and let them connect to it (docs/guides/connect.md)"
            )
        reached.add(host)
        setattr(self.session, _REACHED_ATTR, reached)

    def register_profile(self, profile: Any) -> Any:
        """``profile``, registered on the server (asking its ``id`` does)."""
        profile.id  # noqa: B018  (the server checks and registers the profile here)
        return profile

    def share(self, data: bytes, name: str) -> Shared:
        """A session artifact (kept on the server until the session ends)."""
        with tempfile.TemporaryDirectory(prefix="sparktf-share-") as folder:
            path = os.path.join(folder, f"sparktf-{name}-{uuid.uuid4().hex}.bin")
            with open(path, "wb") as out:
                out.write(data)
            self.session.addArtifacts(path, file=True)
        return ArtifactBytes(os.path.basename(path))

    def add_python_file(self, path: str) -> None:
        self.session.addArtifacts(path, pyfile=True)

    @property
    def holder(self) -> Any:
        return self.session

    @staticmethod
    def holder_stopped(holder: Any) -> bool:
        return holder.is_stopped

    def add_tag(self, tag: str) -> None:
        self.session.addTag(tag)

    def remove_tag(self, tag: str) -> None:
        self.session.removeTag(tag)

    def run_tasks(self, num_tasks: int, function: TaskFunction, tag: str, barrier: bool = False,
                  description: Optional[str] = None) -> List[Optional[bytes]]:
        with self.tagged(tag):
            tasks = self.session.range(0, num_tasks, 1, num_tasks)
            rows = tasks.mapInArrow(_ArrowTasks(function), _RESULT_SCHEMA, barrier=barrier).collect()
            return [row[0] for row in rows]

    def cancel_tag(self, tag: str) -> None:
        self.session.interruptTag(tag)

    def spark_context(self, what: str, alternative: str) -> Any:
        raise SparkTFError(
            f"{what} needs a SparkContext (RDDs), which a Spark Connect session does not have. {alternative}"
        )
