"""Storage faults: a store's transport errors named as ``StorageError``, transient ones retried first.

Every call a remote store makes (:class:`~sparktf.storage.fsspec_store.FsspecStore`,
:class:`~sparktf.storage.hadoop.HadoopStore`) goes through :func:`call`, the
one seam between sparktf and the storage libraries. It

* retries a *transient* failure (a reset or refused connection, a timeout, a
  throttled or 5xx answer) :data:`RETRIES` times, on top of the library's own
  retries, with a growing pause;
* turns what is left into a :class:`~sparktf.errors.StorageError` that names
  the path, the route and the retries made (``transient`` set when retrying
  later may help: the next checkpoint, a relaunched task).

The libraries are optional and imported only when already loaded (the error
came from them, so they are): errors are classified by type where the
library is there, by the module that defined them otherwise.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Iterator, Optional, TypeVar

from sparktf.errors import StorageError

__all__ = ["RETRIES", "call", "storage_error", "transport_error", "is_transient"]

T = TypeVar("T")

#: Retries of a transient failure at the seam (the store's library has retried before each).
RETRIES = 2
#: The pause before the first retry, doubled for each next one.
BACKOFF_SECONDS = 0.5

# The libraries whose exceptions are transport errors (the root of the defining module).
_TRANSPORT_MODULES = frozenset({
    "botocore", "aiobotocore", "boto3", "s3fs", "aiohttp", "gcsfs", "google", "adlfs", "azure", "pyarrow",
    "urllib3", "requests", "fsspec",
})
# Words in an exception's class name that say it is worth trying again.
_TRANSIENT_WORDS = ("timeout", "connection", "connect", "disconnect", "reset", "unavailable", "throttl",
                    "slowdown", "payload", "incompleteread", "streaming", "transport", "servicerequest",
                    "serviceresponse", "temporar", "retry", "eof")
_TRANSIENT_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
                              "InternalError", "ServiceUnavailable", "RequestLimitExceeded", "TooManyRequests"})


def call(what: str, uri: str, route: str, action: Callable[[], T], retries: Optional[int] = None) -> T:
    """``action()``, retried while it fails transiently; its transport errors raised as ``StorageError``.

    Parameters
    ----------
    what : str
        What was tried, for the message (``"cannot write"``).
    uri : str
        The path as the user wrote it.
    route : str
        How the store is reached (``"fsspec s3fs"``, ``"Hadoop FileSystem"``).
    action : callable
        The store's call.
    retries : int, optional
        Retries of a transient failure (default :data:`RETRIES`).

    Raises
    ------
    StorageError
        For a missing path, a refused permission, any ``OSError`` and any
        transport error of the storage libraries.
    """
    retries = RETRIES if retries is None else retries
    for attempt in range(retries + 1):
        try:
            return action()
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified below; anything else re-raised as it is
            if not (isinstance(exc, OSError) or transport_error(exc)):
                raise
            if attempt < retries and is_transient(exc):
                time.sleep(BACKOFF_SECONDS * 2 ** attempt)
                continue
            raise storage_error(what, uri, route, exc, attempt) from exc
    raise AssertionError("unreachable")  # pragma: no cover


def storage_error(what: str, uri: str, route: str, exc: BaseException, retries: int = 0) -> StorageError:
    """The ``StorageError`` for ``exc``, raised by ``route`` doing ``what`` to ``uri`` after ``retries`` retries."""
    if isinstance(exc, FileNotFoundError) or _java_name(exc).endswith(".FileNotFoundException"):
        return StorageError(f"{what} {uri!r}: it does not exist ({route}). Check the path.", path=uri, route=route,
                            retries=retries)
    if isinstance(exc, PermissionError):
        return StorageError(f"{what} {uri!r}: permission denied ({route}: {_describe(exc)}). Check the credentials.",
                            path=uri, route=route, retries=retries)
    transient = is_transient(exc)
    again = f"retried {retries} {'time' if retries == 1 else 'times'} after" if retries else "after"
    tried = f"{again} the library's own retries" if transient else "not retried"
    hint = (" The store did not answer or broke off: check its endpoint and the network." if transient else
            " Check the path, the credentials and the store's settings (spark.hadoop.* for Hadoop's FileSystem).")
    return StorageError(f"{what} {uri!r} through {route} ({tried}): {_describe(exc)}.{hint}", path=uri, route=route,
                        retries=retries, transient=transient)


def transport_error(exc: BaseException) -> bool:
    """True when ``exc`` comes from a storage or HTTP library, a network ``OSError`` or Hadoop (a Java exception)."""
    return any(_module_root(cause) in _TRANSPORT_MODULES or isinstance(cause, (ConnectionError, TimeoutError))
               or hasattr(cause, "java_exception") for cause in _causes(exc))


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a failure that trying again may get past."""
    if isinstance(exc, StorageError):
        return exc.transient
    return any(_transient_one(cause) for cause in _causes(exc))


def _transient_one(exc: BaseException) -> bool:
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    status = _status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    java = _java_name(exc)
    if java:  # Hadoop's FileSystem: the Java exception's class
        return java.startswith("java.net.") or _transient_name(java.rsplit(".", 1)[-1])
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(exc, aiohttp.ClientError):  # connections, payloads, server errors
        return True
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is not None and isinstance(exc, (botocore.ConnectionError, botocore.HTTPClientError,
                                                 botocore.IncompleteReadError)):
        return True
    return _module_root(exc) in _TRANSPORT_MODULES and _transient_name(type(exc).__name__)


def _status(exc: BaseException) -> Optional[int]:
    """The HTTP status an error carries (botocore's ``ClientError``, aiohttp, gcsfs, azure), if any."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        code = response.get("Error", {}).get("Code")
        if code in _TRANSIENT_CODES:
            return 503
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return int(status) if status else None
    for name in ("status", "status_code", "code"):
        value = getattr(exc, name, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    return None


def _transient_name(name: str) -> bool:
    name = name.lower()
    return any(word in name for word in _TRANSIENT_WORDS)


def _java_name(exc: BaseException) -> str:
    """The class of the Java exception behind a py4j error (Hadoop's FileSystem), else ``""``."""
    java = getattr(exc, "java_exception", None)
    return "" if java is None else str(java.getClass().getName())


def _module_root(exc: BaseException) -> str:
    return type(exc).__module__.split(".")[0]


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what caused it (a library often wraps the transport's error), a few levels deep."""
    seen = 0
    current: Optional[BaseException] = exc
    while current is not None and seen < 5:
        yield current
        current = current.__cause__ or current.__context__
        seen += 1


def _describe(exc: BaseException) -> str:
    java = getattr(exc, "java_exception", None)
    if java is not None:
        name, message = str(java.getClass().getSimpleName()), str(java.getMessage())
    else:
        name, message = type(exc).__name__, str(exc)
    return f"{name}: {' '.join(message.split())[:300] or 'no message'}"
