"""``SessionKind``: what sparktf needs from a Spark session, whatever its kind."""

from __future__ import annotations

import contextlib
import socket
from abc import ABC, abstractmethod
from typing import Any, Callable, Iterable, Iterator, List, Optional

from sparktf.errors import ConfigurationError
from sparktf.spark.jobs import jvm_gone

__all__ = ["SessionKind", "TaskFunction", "Shared", "InlineBytes", "DRIVER_HOST_CONF", "RENDEZVOUS_CONF"]

#: A task of :meth:`SessionKind.run_tasks`: its partition's numbers in, byte strings (or None) out.
TaskFunction = Callable[[Iterable[int]], Iterator[Optional[bytes]]]

#: The address sparktf's listeners in this process bind and the executors connect to.
DRIVER_HOST_CONF = "spark.sparktf.driverHost"
#: ``driver`` (a job channel in this process) or ``barrier`` (ranks meet through ``allGather``).
RENDEZVOUS_CONF = "spark.sparktf.rendezvous"


class Shared(ABC):
    """Bytes shipped once to the executors (a broadcast or a session artifact); ``value`` there."""

    @property
    @abstractmethod
    def value(self) -> bytes:
        """The bytes (on an executor or the driver)."""

    def destroy(self) -> None:
        """Free them on the executors, where the kind can."""


class InlineBytes(Shared):
    """Bytes that travel inside the task's own pickled function: where a session's shared files do not reach the
    tasks (a Spark Connect server's streaming queries do not see its session artifacts). Bounded by
    :data:`INLINE_LIMIT`: they pass through the plan, the server's JVM heap included."""

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)

    @property
    def value(self) -> bytes:
        return self.data

    @classmethod
    def of(cls, data: bytes, what: str, instead: str) -> "InlineBytes":
        """``data`` inline, or a ``ConfigurationError`` naming ``what``, its size and ``instead`` when too large."""
        if len(data) > INLINE_LIMIT:
            raise ConfigurationError(
                f"{what} of {len(data) >> 20} MB would travel inside the query's plan (more than "
                f"{INLINE_LIMIT >> 20} MB): {instead}")
        return cls(data)


#: Most bytes :class:`InlineBytes` carries.
INLINE_LIMIT = 64 << 20


class SessionKind(ABC):
    """One Spark session seen by sparktf.

    Parameters
    ----------
    session : pyspark.sql.SparkSession
        A classic session or a Spark Connect one.
    """

    #: How messages name the kind: ``"classic"`` or ``"Spark Connect"``.
    name: str = ""
    #: Whether the session has a SparkContext and RDDs.
    has_rdds: bool = True
    #: Seconds a task-slot check on a cluster waits for executors still registering (a session just started).
    executor_wait: float = 30.0

    def __init__(self, session: Any) -> None:
        self.session = session

    # ---- settings ---------------------------------------------------------

    @property
    @abstractmethod
    def conf(self) -> Any:
        """The session's settings: an object with ``get(key, default)``."""

    def setting(self, key: str, default: str) -> str:
        """``key`` from this thread's local properties (where the kind has them), else the session's settings."""
        return self.conf.get(key, default)

    @property
    def master(self) -> str:
        """The master URL (``local[2]``, ``spark://...``); empty when the session does not say."""
        return self.conf.get("spark.master", "") or ""

    @property
    def is_local(self) -> bool:
        """Whether tasks run in the driver's JVM (``local``/``local[N]``, not ``local-cluster``)."""
        return self.master == "local" or self.master.startswith("local[")

    @abstractmethod
    def default_parallelism(self) -> int:
        """Spark's default number of partitions: the cluster's cores for a standalone or local master."""

    @abstractmethod
    def default_fs(self) -> str:
        """Hadoop's ``fs.defaultFS`` of the cluster (``file:///`` on a local file system)."""

    @abstractmethod
    def task_slots(self) -> int:
        """How many tasks of the default resource profile the cluster runs at once."""

    @abstractmethod
    def slots(self, profile: Any = None) -> Any:
        """The cluster's :class:`~sparktf.spark.cluster.TaskSlots` now, for ``profile`` (None: the defaults)."""

    @abstractmethod
    def register_profile(self, profile: Any) -> Any:
        """``profile`` (a ``ResourceProfile``) registered with Spark; raises with Spark's reason when refused."""

    def rendezvous_host(self) -> Optional[str]:
        """Where a job's ranks find each other: the job channel's address, or None for ``allGather``.

        ``spark.sparktf.rendezvous`` is ``driver`` (the default: a job
        channel on :meth:`driver_host`, checked) or ``barrier`` (``BarrierTaskContext.allGather``,
        for clusters whose executors cannot open connections to the driver).

        Raises
        ------
        ConfigurationError
            Any other value, or an address this process cannot listen on.
        """
        return self.task_listener_host()

    def task_listener_host(self) -> Optional[str]:
        """The address of this process its tasks connect to (:meth:`driver_host`); None for ``rendezvous=barrier``.

        Runs no job (unlike a Connect session's :meth:`rendezvous_host`).

        Raises
        ------
        ConfigurationError
            Another ``spark.sparktf.rendezvous``, or an address this process cannot listen on.
        """
        mode = self.conf.get(RENDEZVOUS_CONF, "driver")
        if mode == "barrier":
            return None
        if mode != "driver":
            raise ConfigurationError(f"{RENDEZVOUS_CONF} must be 'driver' or 'barrier', got {mode!r}")
        return self.driver_host()

    def listen_host(self) -> str:
        """The address job channels bind (``spark.sparktf.driverHost``, else ``spark.driver.host``), unchecked."""
        return self.conf.get(DRIVER_HOST_CONF, None) or self.conf.get("spark.driver.host", None) or "127.0.0.1"

    def driver_host(self) -> str:
        """The address this process's listeners bind, and the executors connect to.

        ``spark.sparktf.driverHost`` when set, else ``spark.driver.host``.

        Raises
        ------
        ConfigurationError
            When that address is not one of this machine's, so nothing
            could listen on it (naming ``spark.sparktf.driverHost``).
        """
        chosen = self.conf.get(DRIVER_HOST_CONF, None)
        host = self.listen_host()
        try:
            with socket.create_server((host, 0)):
                pass
        except OSError as error:
            where = (f"{DRIVER_HOST_CONF}={host!r} is not an address of this machine" if chosen else
                     f"spark.driver.host={host!r}: the {self.name} session's driver runs on another machine")
            raise ConfigurationError(
                f"sparktf listens for its tasks in this process, but cannot bind {host!r} "
                f"({error.strerror or error}): {where}. Set {DRIVER_HOST_CONF} to an address of this machine "
                "that the executors can reach (docs/guides/connect.md)"
            ) from None
        return host

    # ---- code and files on the executors -----------------------------------

    @abstractmethod
    def add_python_file(self, path: str) -> None:
        """Put the ``.py``/``.zip`` file at ``path`` on the executors' Python path."""

    @staticmethod
    @abstractmethod
    def holder_stopped(holder: Any) -> bool:
        """Whether ``holder`` (a :attr:`holder` of this kind) was stopped."""

    @abstractmethod
    def share(self, data: bytes, name: str) -> Shared:
        """Ship ``data`` to the executors once (``name`` says what it is: ``"model"``, ...)."""

    @property
    @abstractmethod
    def holder(self) -> Any:
        """What lives as long as the session, with its ``stop``: the SparkContext, or the Connect session."""

    # ---- jobs -------------------------------------------------------------

    @abstractmethod
    def add_tag(self, tag: str) -> None:
        """Tag the jobs this thread starts from now on with ``tag``."""

    @abstractmethod
    def remove_tag(self, tag: str) -> None:
        """Stop tagging this thread's jobs with ``tag``."""

    @contextlib.contextmanager
    def tagged(self, tag: str) -> Iterator[None]:
        """This thread's jobs carry ``tag`` inside the ``with`` block; Ctrl-C there cancels them.

        A ``KeyboardInterrupt`` (Ctrl-C in a script or a notebook's interrupt)
        cancels the running jobs tagged ``tag`` before it goes on up.
        """
        self.add_tag(tag)
        try:
            yield
        except KeyboardInterrupt:
            with contextlib.suppress(Exception):  # the session may be gone; the interrupt goes on
                self.cancel_tag(tag)
            raise
        finally:
            try:
                self.remove_tag(tag)
            except Exception as error:
                if not jvm_gone(error):  # a dead JVM's error is already on its way
                    raise

    @abstractmethod
    def run_tasks(self, num_tasks: int, function: TaskFunction, tag: str, barrier: bool = False,
                  description: Optional[str] = None) -> List[Optional[bytes]]:
        """Run ``function`` in ``num_tasks`` tasks (task ``i`` gets ``[i]``) under job tag ``tag``.

        Returns the values the tasks yield, in task order. ``barrier=True``
        runs them as one barrier stage (``BarrierTaskContext`` works in them).
        Only this thread's jobs carry ``tag``.
        """

    @abstractmethod
    def cancel_tag(self, tag: str) -> None:
        """Cancel the running jobs tagged ``tag`` (from any thread); nothing when there are none."""

    @abstractmethod
    def spark_context(self, what: str, alternative: str) -> Any:
        """The SparkContext, for what needs RDDs.

        Raises
        ------
        SparkTFError
            In a session without one (Spark Connect), before any job: names
            ``what`` and ``alternative``.
        """
