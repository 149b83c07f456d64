"""``Store``: one interface over every kind of storage sparktf reads and writes (after fsspec's AbstractFileSystem).

sparktf needs few operations: list a folder, glob, check, delete, and move
whole files and folders between this machine and the store. Everything is
staged through local files, so a store never has to stream bytes through
Python (the Hadoop route copies them inside the JVM). A file written with
:meth:`Store.upload` or :meth:`Store.atomic_file` is either complete or
absent at its final name: a rename where renames are atomic, a single-object
write on object stores.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import BinaryIO, Iterator, List, Optional

__all__ = ["Store", "temp_name"]


def temp_name(uri: str) -> str:
    """The in-progress name of ``uri``: hidden from listings of ``checkpoint-*`` and cleaned up by its writer."""
    return f"{uri}.tmp-{os.getpid()}"


class Store(ABC):
    """The storage of one scheme, reached one way (local, Hadoop ``FileSystem``, fsspec).

    Methods take full paths or URIs as the user wrote them.
    """

    #: How the store is reached, for messages ("local", "Hadoop FileSystem", "fsspec s3fs").
    route = ""

    @abstractmethod
    def exists(self, uri: str) -> bool:
        """True when a file or folder is at ``uri``."""

    @abstractmethod
    def isdir(self, uri: str) -> bool:
        """True when ``uri`` is a folder."""

    @abstractmethod
    def listdir(self, uri: str) -> List[str]:
        """The names in folder ``uri`` (empty when it does not exist)."""

    @abstractmethod
    def glob(self, pattern: str) -> List[str]:
        """The URIs matching ``pattern`` (``*``, ``?``, ``[...]``), sorted."""

    @abstractmethod
    def size(self, uri: str) -> int:
        """Bytes of the file ``uri``."""

    @abstractmethod
    def makedirs(self, uri: str) -> None:
        """Create folder ``uri`` and its parents (object stores: nothing to do)."""

    @abstractmethod
    def delete(self, uri: str, recursive: bool = False) -> None:
        """Remove ``uri`` (a folder only with ``recursive``); a missing one is no error."""

    @abstractmethod
    def upload(self, local: str, uri: str) -> None:
        """Copy the local file or folder ``local`` to ``uri``; a file lands complete or not at all."""

    @abstractmethod
    def download(self, uri: str, local: str) -> None:
        """Copy the file or folder ``uri`` to the local path ``local``."""

    @abstractmethod
    def open_input(self, uri: str) -> BinaryIO:
        """``uri`` opened for reading bytes."""

    def open_chunked(self, uri: str, chunk_bytes: int, size: Optional[int] = None) -> BinaryIO:
        """``uri`` opened for reads of about ``chunk_bytes`` each: a remote store fetches what a read asks for and
        buffers nothing beyond it, and takes ``size`` (the file's bytes, when known) without asking (here:
        :meth:`open_input`)."""
        return self.open_input(uri)

    def executor_uri(self, uri: str) -> str:
        """What an executor's Python opens for ``uri`` (the Hadoop route resolves mount points)."""
        return uri

    @contextmanager
    def atomic_file(self, uri: str) -> Iterator[str]:
        """A local path to write; when the block ends without error it becomes ``uri``, complete."""
        directory = tempfile.mkdtemp(prefix="sparktf-upload-")
        try:
            local = os.path.join(directory, os.path.basename(uri.rstrip("/")) or "file")
            yield local
            self.upload(local, uri)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def read_bytes(self, uri: str) -> bytes:
        """The whole file ``uri`` (small files: metadata, event files)."""
        with self.open_input(uri) as handle:
            return handle.read()

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Write ``data`` as the file ``uri``, complete or not at all."""
        with self.atomic_file(uri) as local:
            with open(local, "wb") as handle:
                handle.write(data)
