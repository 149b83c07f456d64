"""Local copies of stored files and folders, for code that needs a local path (TensorFlow, Keras, NumPy)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Iterator

from sparktf.errors import StorageError
from sparktf.storage.routes import store_for
from sparktf.storage.uri import basename, is_local, local_path

__all__ = ["local_copy", "kept_local_copy", "read_text", "write_text"]


@contextmanager
def local_copy(uri: str, what: str = "path") -> Iterator[str]:
    """A local path holding the file or folder ``uri`` while the block runs (a local path is itself).

    Raises
    ------
    StorageError
        When ``uri`` does not exist or cannot be read.
    """
    if is_local(uri):
        yield local_path(uri)
        return
    directory = tempfile.mkdtemp(prefix="sparktf-copy-")
    try:
        yield _download(uri, directory, what)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def kept_local_copy(uri: str, what: str = "path") -> str:
    """A local path holding ``uri`` until this process exits (a local path is itself, made absolute)."""
    if is_local(uri):
        return os.path.abspath(local_path(uri))
    directory = tempfile.mkdtemp(prefix="sparktf-copy-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return _download(uri, directory, what)


def _download(uri: str, directory: str, what: str) -> str:
    store = store_for(uri, what)
    if not store.exists(uri):
        raise StorageError(f"the {what} {uri!r} does not exist. Check the path ({store.route}).")
    local = os.path.join(directory, basename(uri) or "copy")
    store.download(uri, local)
    return local


def read_text(uri: str, what: str = "file") -> str:
    """The UTF-8 text of the file ``uri``."""
    store = store_for(uri, what)
    if not store.exists(uri):
        raise StorageError(f"the {what} {uri!r} does not exist. Check the path ({store.route}).")
    return store.read_bytes(uri).decode("utf-8")


def write_text(uri: str, text: str, what: str = "file") -> None:
    """Write ``text`` (UTF-8) as the file ``uri``, complete or not at all."""
    store_for(uri, what).write_bytes(uri, text.encode("utf-8"))
