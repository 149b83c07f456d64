"""Exceptions raised by sparktf on purpose.

Every message names the offending thing (partition, record index, expected vs
actual shape or dtype, worker rank) and says what to do about it.
"""

from typing import Optional

__all__ = ["SparkTFError", "DataError", "TrainingError", "ModelError", "CollectiveError", "DriverJVMGone", "StorageError",
           "ConfigurationError"]


class SparkTFError(Exception):
    """Base class of every error sparktf raises on purpose."""


class DataError(SparkTFError, ValueError):
    """Bad records, specs, batch sizes or dataset options."""


class TrainingError(SparkTFError, RuntimeError):
    """A failure during training: non-finite loss, a failed worker, a timeout."""


class ModelError(TrainingError):
    """The model fails the same way on every attempt (e.g. a layer that raises): never relaunched."""


class CollectiveError(TrainingError):
    """A failure of the all-reduce collective: a dead, silent or unauthenticated peer."""


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
