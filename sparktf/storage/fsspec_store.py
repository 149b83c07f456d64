"""The route through fsspec: a Spark Connect client, the executors' Python, and schemes Hadoop does not know.

The scheme's package is an optional extra (``sparktf[s3]`` -> s3fs,
``[gcs]`` -> gcsfs, ``[azure]`` -> adlfs; ``hdfs`` is pyarrow's). Credentials
come from the process's environment as each package reads it
(``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``GOOGLE_APPLICATION_CREDENTIALS``,
instance roles, ...).
"""

from __future__ import annotations

import os
from typing import Any, BinaryIO, Callable, List, Optional, TypeVar

from sparktf.storage import faults
from sparktf.storage.base import Store, temp_name
from sparktf.storage.uri import OBJECT_STORE_SCHEMES

__all__ = ["FsspecStore"]

T = TypeVar("T")


class FsspecStore(Store):
    """One fsspec file system, for the URIs of one scheme.

    Parameters
    ----------
    scheme : str
        The scheme as users write it (``s3a``); URIs returned keep it.
    filesystem : fsspec.AbstractFileSystem
        The file system fsspec has for it.
    """

    def __init__(self, scheme: str, filesystem: Any):
        self.scheme = scheme
        self.fs = filesystem
        self.route = f"fsspec {type(filesystem).__module__.split('.')[0]}"

    def _strip(self, uri: str) -> str:
        return self.fs._strip_protocol(uri)

    def _uri(self, path: str) -> str:
        return f"{self.scheme}://{path}"

    def _call(self, what: str, uri: str, action: Callable[[], T]) -> T:
        """``action()`` through the one seam to the storage libraries (transient failures retried, errors named)."""
        return faults.call(what, uri, self.route, action)

    def _fresh(self, uri: str) -> str:
        """The path of ``uri``, with fsspec's cached listings dropped (other processes write here too)."""
        self.fs.invalidate_cache()
        return self._strip(uri)

    def exists(self, uri: str) -> bool:
        return bool(self._call("cannot check", uri, lambda: self.fs.exists(self._fresh(uri))))

    def isdir(self, uri: str) -> bool:
        return bool(self._call("cannot check", uri, lambda: self.fs.isdir(self._fresh(uri))))

    def listdir(self, uri: str) -> List[str]:
        def names() -> List[str]:
            path = self._fresh(uri)
            if not self.fs.isdir(path):
                return []
            return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(path, detail=False))

        return self._call("cannot list", uri, names)

    def glob(self, pattern: str) -> List[str]:
        return sorted(self._uri(path) for path in self._call("cannot list", pattern,
                                                             lambda: self.fs.glob(self._fresh(pattern))))

    def size(self, uri: str) -> int:
        return int(self._call("cannot read the size of", uri, lambda: self.fs.size(self._strip(uri))))

    def makedirs(self, uri: str) -> None:
        self._call("cannot create", uri, lambda: self.fs.makedirs(self._strip(uri), exist_ok=True))

    def delete(self, uri: str, recursive: bool = False) -> None:
        def remove() -> None:
            path = self._strip(uri)
            if self.fs.exists(path):
                self.fs.rm(path, recursive=recursive)

        self._call("cannot delete", uri, remove)

    def upload(self, local: str, uri: str) -> None:
        target = self._strip(uri)
        if os.path.isdir(local):
            self._call("cannot write", uri, lambda: self.fs.put(local.rstrip("/") + "/", target, recursive=True))
        elif self.scheme in OBJECT_STORE_SCHEMES:  # one object, visible only once its upload completes
            self._call("cannot write", uri, lambda: self.fs.put_file(local, target))
        else:
            staged = self._strip(temp_name(uri))

            def write_and_rename() -> None:
                self.fs.put_file(local, staged)
                self.fs.mv(staged, target)

            self._call("cannot write", uri, write_and_rename)

    def download(self, uri: str, local: str) -> None:
        def fetch() -> None:
            source = self._strip(uri)
            if self.fs.isdir(source):
                self.fs.get(source.rstrip("/") + "/", local, recursive=True)
            else:
                self.fs.get_file(source, local)

        self._call("cannot read", uri, fetch)

    def open_input(self, uri: str) -> BinaryIO:
        return self._call("cannot read", uri, lambda: self.fs.open(self._strip(uri), "rb"))

    def open_chunked(self, uri: str, chunk_bytes: int, size: Optional[int] = None) -> BinaryIO:
        """An object store's file without fsspec's cache: each read is one ranged request of what it asks for
        (the default would fetch a block of up to 50 MB ahead of every read). With ``size``, the object's
        details are not asked for (no HEAD request; nor is its ETag compared between reads)."""
        if self.scheme not in OBJECT_STORE_SCHEMES:
            return self.open_input(uri)
        from fsspec.spec import AbstractBufferedFile

        def open_file() -> BinaryIO:
            path = self._strip(uri)
            handle = self.fs.open(path, "rb", block_size=chunk_bytes, cache_type="none",
                                  **({} if size is None else {"size": size}))
            if size is not None and isinstance(handle, AbstractBufferedFile):
                handle.details = {"name": path, "size": size, "type": "file"}
            return handle

        return self._call("cannot read", uri, open_file)
