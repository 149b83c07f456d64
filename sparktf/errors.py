"""Exceptions raised by sparktf on purpose.

Every message names the offending thing (partition, record index, expected vs
actual shape or dtype, worker rank) and says what to do about it.
"""

import traceback as traceback_module
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, Optional, Tuple

__all__ = ["SparkTFError", "DataError", "TrainingError", "ModelError", "CollectiveError", "DriverJVMGone", "StorageError",
           "ConfigurationError", "InternalError", "CancelledError", "FailureRecord", "WorkerTraceback", "task_record",
           "record_of", "relaunch_helps"]


class SparkTFError(Exception):
    """Base class of every error sparktf raises on purpose."""


class DataError(SparkTFError, ValueError):
    """Bad records, specs, batch sizes or dataset options.

    Attributes
    ----------
    bad_row : tuple of int or None
        ``(partition, row)`` of the record that failed (the row 0-based
        within the partition), when one record did.
    """

    def __init__(self, *args: Any, bad_row: Optional[Tuple[int, int]] = None):
        super().__init__(*args)
        self.bad_row = bad_row


class TrainingError(SparkTFError, RuntimeError):
    """A failure during training: non-finite loss, a failed worker, a timeout."""


class ModelError(TrainingError):
    """The model fails the same way on every attempt (e.g. a layer that raises): never relaunched."""


class CollectiveError(TrainingError):
    """A failure of the all-reduce collective: a dead, silent or unauthenticated peer."""


class InternalError(TrainingError):
    """A bug of sparktf's own (not of the data, the model or the cluster): never relaunched; please report it with
    the traceback in its ``__cause__``."""


class CancelledError(SparkTFError):
    """A call that Ctrl-C (``KeyboardInterrupt``) in the driver cancelled: its jobs were cancelled, nothing is
    relaunched."""


class DriverJVMGone(SparkTFError):
    """The Spark driver's JVM died (or was killed) while sparktf was using it; start a new session."""


class StorageError(SparkTFError, OSError):
    """A path or URI that cannot be opened, read or written (unknown scheme, missing file, no permission, a store
    that does not answer).

    Attributes
    ----------
    path, route : str or None
        The path as given, and how its store was reached (``"fsspec s3fs"``, ``"Hadoop FileSystem"``).
    retries : int
        The retries made before giving up (besides the store library's own).
    transient : bool
        True when the store broke off or did not answer: a later try may succeed.
    """

    def __init__(self, message: str = "", *, path: Optional[str] = None, route: Optional[str] = None,
                 retries: int = 0, transient: bool = False):
        super().__init__(message)
        self.path, self.route, self.retries, self.transient = path, route, retries, transient


class ConfigurationError(SparkTFError):
    """A setting or the session cannot work as configured (an address this process cannot listen on or the
    executors cannot reach, a ``spark.sparktf.*`` value out of range): it fails the same way on every try, so it is
    raised at once, never relaunched."""


class WorkerTraceback(Exception):
    """The traceback a failed Spark task printed, as text: the one ``__cause__`` of the error sparktf raises on the
    driver for that task's failure (Spark's and Py4J's wrappers of it are left out)."""

    def __str__(self) -> str:
        return "the worker's traceback:\n" + (self.args[0] if self.args else "")


# A failure as data. A worker that knows why it failed sends a FailureRecord to the driver (in its last
# heartbeat); to_error() gives back the same class with its fields, and relaunch_helps decides whether
# training relaunches. Nothing reads an error's text to learn its class.
_MAX_MESSAGE_CHARS = 4000  # a message longer than this is cut: it travels in a heartbeat header
_MAX_TRACEBACK_CHARS = 8000  # a traceback keeps its last characters (the innermost frames and the error)
_KINDS = {cls.__name__: cls for cls in (DataError, ModelError, StorageError, CollectiveError, InternalError,
                                        ConfigurationError, DriverJVMGone, CancelledError, TrainingError,
                                        SparkTFError)}
# failures that happen the same way again: raised at once, never relaunched
_DETERMINISTIC = {"DataError", "ModelError", "ConfigurationError", "InternalError", "DriverJVMGone", "CancelledError"}
_UNKNOWN = "task failure"  # anything that is not sparktf's own error: a lost worker, a killed process


@dataclass(frozen=True)
class FailureRecord:
    """One failure, serialisable: its class, message and where it happened.

    Attributes
    ----------
    kind : str
        The sparktf error class (``"DataError"``, ``"StorageError"``, ...) or
        ``"task failure"`` for any other exception.
    message : str
        The error's message (at most 4,000 characters: it travels in a heartbeat).
    transient : bool
        A ``StorageError`` whose store broke off: a later try may succeed.
    path, route : str or None
        A ``StorageError``'s path and how its store was reached.
    retries : int
        A ``StorageError``'s retries before it gave up.
    rank : int or None
        The training rank that failed, if one did.
    shard : int or None
        The input shard that rank read (not always its own).
    bad_row : tuple of int or None
        A ``DataError``'s ``(partition, row)``, when one record failed.
    traceback : str
        The traceback where the error was raised, as Python prints it (its
        last 8,000 characters); empty when it was not raised.
    """

    kind: str
    message: str
    transient: bool = False
    path: Optional[str] = None
    route: Optional[str] = None
    retries: int = 0
    rank: Optional[int] = None
    shard: Optional[int] = None
    bad_row: Optional[Tuple[int, int]] = None
    traceback: str = ""

    @classmethod
    def of(cls, error: BaseException, rank: Optional[int] = None, shard: Optional[int] = None) -> "FailureRecord":
        """The record of ``error``; its class is the nearest sparktf error class it derives from."""
        kind = next((klass.__name__ for klass in type(error).__mro__ if _KINDS.get(klass.__name__) is klass), _UNKNOWN)
        message = str(error) if kind != _UNKNOWN else f"{type(error).__name__}: {error}"
        printed = "".join(traceback_module.format_exception(error)) if error.__traceback__ is not None else ""
        record = cls(kind, message[:_MAX_MESSAGE_CHARS], rank=rank, shard=shard,
                     traceback=printed[-_MAX_TRACEBACK_CHARS:])
        if isinstance(error, StorageError):
            return replace(record, transient=error.transient, path=error.path, route=error.route,
                           retries=error.retries)
        if isinstance(error, DataError) and error.bad_row is not None:
            return replace(record, bad_row=tuple(int(value) for value in error.bad_row))
        return record

    @property
    def relaunch_helps(self) -> bool:
        """Whether relaunching the work that failed may succeed.

        Not for bad data, a failing model, a setting that cannot work, a bug
        of sparktf's or a dead driver JVM, nor for a path its store refuses:
        those fail the same way again. Everything else (a lost worker or
        peer, a timeout, a store that broke off) may not.
        """
        if self.kind == "StorageError":
            return self.transient
        return self.kind not in _DETERMINISTIC

    def to_error(self) -> SparkTFError:
        """The error this record describes, of its class (a ``TrainingError`` for a task failure), with the record as
        its ``record`` and the worker's traceback (:class:`WorkerTraceback`) as its ``__cause__``."""
        if self.kind == "StorageError":
            error: SparkTFError = StorageError(self.message, path=self.path, route=self.route, retries=self.retries,
                                               transient=self.transient)
        elif self.kind == "DataError":
            error = DataError(self.message, bad_row=self.bad_row)
        else:
            error = _KINDS.get(self.kind, TrainingError)(self.message)
        error.record = self
        error.__cause__ = WorkerTraceback(self.traceback) if self.traceback else None
        return error

    def to_wire(self) -> Dict[str, Any]:
        """A JSON-able dict of the record (:meth:`from_wire` reads it back)."""
        return asdict(self)

    @classmethod
    def from_wire(cls, data: Any) -> "FailureRecord":
        """The record :meth:`to_wire` wrote; a ``ValueError`` for anything else."""
        if not isinstance(data, dict) or set(data) != set(cls.__dataclass_fields__):
            raise ValueError(f"not a failure record: {str(data)[:200]}")
        kind = str(data["kind"])
        if kind not in _KINDS and kind != _UNKNOWN:
            raise ValueError(f"a failure record of unknown kind {kind[:100]!r}")
        optional_int = (lambda value: None if value is None else int(value))
        optional_str = (lambda value: None if value is None else str(value)[:_MAX_MESSAGE_CHARS])
        bad_row = None if data["bad_row"] is None else tuple(int(value) for value in data["bad_row"])
        if bad_row is not None and len(bad_row) != 2:
            raise ValueError(f"a failure record whose bad_row is not (partition, row): {bad_row[:4]}")
        return cls(kind, str(data["message"])[:_MAX_MESSAGE_CHARS], bool(data["transient"]), optional_str(data["path"]),
                   optional_str(data["route"]), int(data["retries"]), optional_int(data["rank"]),
                   optional_int(data["shard"]), bad_row, str(data["traceback"])[-_MAX_TRACEBACK_CHARS:])


def task_record(error: BaseException, rank: Optional[int] = None,
                shard: Optional[int] = None) -> Optional[FailureRecord]:
    """What a task reports to the driver when it fails with ``error``: the record of a sparktf error (the data, the
    model, a store, a peer, a setting: the driver decides on it), None for anything else (a lost worker, a killed
    task: Spark's own failure tells it). The one rule of every road a failure takes to the driver."""
    return FailureRecord.of(error, rank, shard) if isinstance(error, SparkTFError) else None


def record_of(error: BaseException) -> FailureRecord:
    """The record an error raised on the driver was made from (:meth:`FailureRecord.to_error`), else its own."""
    record = getattr(error, "record", None)
    return record if isinstance(record, FailureRecord) else FailureRecord.of(error)


def relaunch_helps(error: BaseException) -> bool:
    """Whether relaunching the work that failed with ``error`` may succeed (the driver's one rule).

    Decided by the error's :class:`FailureRecord` alone (:attr:`FailureRecord.relaunch_helps`): not for bad data,
    a failing model, a setting that cannot work, a bug of sparktf's, a path its store refuses or a dead driver JVM.
    Those fail the same way again, so they are raised at once.
    """
    return record_of(error).relaunch_helps
