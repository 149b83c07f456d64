"""The route through the classic Spark session's Hadoop ``FileSystem``: the cluster's connectors and credentials.

Bytes never pass through py4j: files are staged on the driver's local disk
and copied by the JVM (``copyFromLocalFile`` / ``copyToLocalFile``), which
streams them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, BinaryIO, Callable, List, TypeVar

from sparktf.errors import StorageError
from sparktf.storage import faults
from sparktf.storage.base import Store, temp_name
from sparktf.storage.uri import OBJECT_STORE_SCHEMES, parent, scheme_of

__all__ = ["HadoopStore", "hadoop_knows"]

T = TypeVar("T")


def hadoop_knows(sc: Any, scheme: str) -> bool:
    """True when the session's Hadoop configuration has a ``FileSystem`` for ``scheme`` (and its class loads)."""
    from py4j.protocol import Py4JJavaError

    jvm = sc._jvm
    try:
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, sc._jsc.hadoopConfiguration())
        return True
    except Py4JJavaError:
        return False


class HadoopStore(Store):
    """A scheme of the Spark session's Hadoop configuration (``hdfs``, ``viewfs``, ``s3a`` with hadoop-aws, ...).

    Parameters
    ----------
    sc : pyspark.SparkContext
        The classic session's context (its JVM and Hadoop configuration).
    """

    route = "Hadoop FileSystem"

    def __init__(self, sc: Any):
        self._jvm = sc._jvm
        self._conf = sc._jsc.hadoopConfiguration()

    # --------------------------------------------------------------- helpers

    def _path(self, uri: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(uri)

    def _fs(self, uri: str) -> Any:
        return self._path(uri).getFileSystem(self._conf)

    def _call(self, what: str, uri: str, action: Callable[[], T]) -> T:
        """``action()`` through the one seam to the storage libraries (transient failures retried, errors named)."""
        return faults.call(what, uri, self.route, action)

    # --------------------------------------------------------------- Store

    def exists(self, uri: str) -> bool:
        return bool(self._call("cannot check", uri, lambda: self._fs(uri).exists(self._path(uri))))

    def isdir(self, uri: str) -> bool:
        def check() -> bool:
            fs, path = self._fs(uri), self._path(uri)
            return bool(fs.exists(path) and fs.getFileStatus(path).isDirectory())

        return self._call("cannot check", uri, check)

    def listdir(self, uri: str) -> List[str]:
        def names() -> List[str]:
            fs, path = self._fs(uri), self._path(uri)
            if not fs.exists(path):
                return []
            return sorted(status.getPath().getName() for status in fs.listStatus(path))

        return self._call("cannot list", uri, names)

    def glob(self, pattern: str) -> List[str]:
        def matches() -> List[str]:
            found = self._fs(pattern).globStatus(self._path(pattern))
            return sorted(status.getPath().toString() for status in (found or []))

        return self._call("cannot list", pattern, matches)

    def size(self, uri: str) -> int:
        return int(self._call("cannot read the size of", uri,
                              lambda: self._fs(uri).getFileStatus(self._path(uri)).getLen()))

    def makedirs(self, uri: str) -> None:
        self._call("cannot create", uri, lambda: self._fs(uri).mkdirs(self._path(uri)))

    def delete(self, uri: str, recursive: bool = False) -> None:
        self._call("cannot delete", uri, lambda: self._fs(uri).delete(self._path(uri), bool(recursive)))

    def upload(self, local: str, uri: str) -> None:
        source = self._path(os.path.abspath(local))
        if os.path.isdir(local) or self._is_object_store(uri):  # folders need no atomicity; objects land whole
            self._call("cannot write", uri, lambda: self._fs(uri).copyFromLocalFile(False, True, source,
                                                                                   self._path(uri)))
            return
        staged = temp_name(uri)

        def write_and_rename() -> None:
            fs, target = self._fs(uri), self._path(uri)
            fs.copyFromLocalFile(False, True, source, self._path(staged))
            if fs.exists(target):
                fs.delete(target, False)
            if not fs.rename(self._path(staged), target):
                fs.delete(self._path(staged), False)
                raise StorageError(f"cannot write {uri!r}: Hadoop's FileSystem refused to rename {staged!r} to it")

        self._call("cannot write", uri, write_and_rename)

    def download(self, uri: str, local: str) -> None:
        self._call("cannot read", uri, lambda: self._fs(uri).copyToLocalFile(
            False, self._path(uri), self._path(os.path.abspath(local)), True))

    def open_input(self, uri: str) -> BinaryIO:
        """A local copy, opened and already unlinked (its space is freed when it is closed)."""
        staged = tempfile.mkdtemp(prefix="sparktf-read-")
        local = os.path.join(staged, "file")
        try:
            self.download(uri, local)
            return open(local, "rb")
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def executor_uri(self, uri: str) -> str:
        """The URI behind mount points (``viewfs`` -> its target), which executors open without Hadoop."""
        return str(self._call("cannot resolve", uri, lambda: self._fs(uri).resolvePath(self._path(uri)).toString()))

    def _is_object_store(self, uri: str) -> bool:
        """Whether ``uri``'s folder is (behind any mount point) an object store."""
        folder = parent(uri)
        return scheme_of(self.executor_uri(folder) if self.exists(folder) else uri) in OBJECT_STORE_SCHEMES
