"""Which store opens a path: local, the classic session's Hadoop ``FileSystem``, or fsspec.

The one place that decides, so no other module asks what kind of session or
storage it runs with:

1. A local path or ``file:`` URI: the local file system.
2. A scheme the classic Spark session's Hadoop configuration knows (in the
   driver of a classic session): Hadoop's ``FileSystem``, with the cluster's
   connectors and credentials, exactly as ``spark.read`` uses them.
3. Anywhere else (a Spark Connect client, the executors' Python, a scheme
   without a Hadoop ``FileSystem``): fsspec, with the scheme's package.
4. Nothing: :class:`~sparktf.errors.StorageError` naming the scheme and
   what to install or set. A URI never becomes a local folder.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Dict, Optional, Tuple

from sparktf.errors import StorageError
from sparktf.process_state import process_cache
from sparktf.storage.base import Store
from sparktf.storage.fsspec_store import FsspecStore
from sparktf.storage.hadoop import HadoopStore, hadoop_knows
from sparktf.storage.local import LocalStore
from sparktf.storage.uri import LOCAL_SCHEMES, install_hint, scheme_of

__all__ = ["store_for", "LOCAL"]

#: The local file system.
LOCAL = LocalStore()



class _Stores:
    """The process's stores (its ``process_state`` entry ``stores``): the classic session's Hadoop routes, by
    JVM context and scheme, and fsspec's, by scheme and digest of the storage environment."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hadoop: Dict[Tuple[int, str], Optional[HadoopStore]] = {}
        self.fsspec: Dict[Tuple[str, str], FsspecStore] = {}

    def clear(self) -> None:
        with self.lock:
            self.hadoop.clear()
            self.fsspec.clear()


def _stores() -> _Stores:
    return process_cache("stores", _Stores)

#: Environment variables that name an endpoint, a credential or a setting of a storage library.
_ENVIRONMENT_PREFIXES = ("AWS_", "GOOGLE_", "GCE_", "GCSFS_", "AZURE_", "FSSPEC_", "HADOOP_", "ARROW_", "LIBHDFS")


def store_for(path: str, what: str = "path") -> Store:
    """The store that opens ``path``.

    Parameters
    ----------
    path : str
        A local path or a URI.
    what : str
        What the path is, for the error (``"model_dir"``, ``"TFRecord path"``).

    Raises
    ------
    StorageError
        When nothing can open the scheme of ``path``.
    """
    scheme = scheme_of(path)
    if scheme in LOCAL_SCHEMES:
        return LOCAL
    hadoop = _hadoop_store(scheme)
    if hadoop is not None:
        return hadoop
    return _fsspec_store(scheme, path, what)


def _hadoop_store(scheme: str) -> Optional[HadoopStore]:
    """The classic session's Hadoop route for ``scheme``, when this process is such a driver and Hadoop knows it."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None or getattr(sc, "_jsc", None) is None:
        return None
    key, stores = (id(sc._jsc), scheme), _stores()
    with stores.lock:
        if key not in stores.hadoop:
            stores.hadoop[key] = HadoopStore(sc) if hadoop_knows(sc, scheme) else None
        return stores.hadoop[key]


def _fsspec_store(scheme: str, path: str, what: str) -> FsspecStore:
    """The fsspec store of ``scheme`` for the process's current storage environment.

    fsspec's own instance cache would keep the first file system made, with the endpoint and keys it
    read then: a later ``AWS_ENDPOINT_URL``, or credentials refreshed in a notebook kernel, would be
    ignored. Stores are kept per scheme and environment instead, and made bypassing that cache.
    """
    key, stores = (scheme, _storage_environment()), _stores()
    with stores.lock:
        if key in stores.fsspec:
            return stores.fsspec[key]
    import fsspec

    try:
        store = FsspecStore(scheme, fsspec.filesystem(scheme, skip_instance_cache=True))
    except (ImportError, ValueError) as exc:
        raise StorageError(_no_route_message(scheme, path, what, exc)) from None
    with stores.lock:
        for stale in [old for old in stores.fsspec if old[0] == scheme]:  # made for an environment since changed
            del stores.fsspec[stale]
        return stores.fsspec.setdefault(key, store)


def _storage_environment() -> str:
    """A digest of the environment variables storage libraries read (endpoints, keys, tokens, regions)."""
    found = sorted((name, value) for name, value in os.environ.items() if name.startswith(_ENVIRONMENT_PREFIXES))
    return hashlib.sha256(repr(found).encode("utf-8")).hexdigest()


def _no_route_message(scheme: str, path: str, what: str, exc: Exception) -> str:
    hint = install_hint(scheme)
    known = "" if isinstance(exc, ImportError) or hint else " (fsspec knows no such protocol)"
    options = [f"{hint} on the driver and the executors"] if hint else []
    options.append(f"give the Spark session a Hadoop FileSystem for it (spark.hadoop.fs.{scheme}.impl "
                   "and its jar)")
    return (
        f"no file system can open the {what} {path!r}: scheme {scheme!r} has no Hadoop FileSystem in this "
        f"session and no fsspec implementation installed{known}. To use it, " + ", or ".join(options)
        + "; for a local folder, pass a plain path or file:///..."
    )
