"""The local file system (plain paths and ``file:`` URIs): renames in the same folder are atomic."""

from __future__ import annotations

import glob
import os
import shutil
from contextlib import contextmanager
from typing import BinaryIO, Iterator, List

from sparktf.errors import StorageError
from sparktf.storage.base import Store, temp_name
from sparktf.storage.uri import local_path, scheme_of

__all__ = ["LocalStore"]


class LocalStore(Store):
    """Files on this machine; a ``file:`` URI keeps its scheme in what :meth:`glob` returns."""

    route = "local"

    def exists(self, uri: str) -> bool:
        return os.path.exists(local_path(uri))

    def isdir(self, uri: str) -> bool:
        return os.path.isdir(local_path(uri))

    def listdir(self, uri: str) -> List[str]:
        path = local_path(uri)
        return sorted(os.listdir(path)) if os.path.isdir(path) else []

    def glob(self, pattern: str) -> List[str]:
        prefix = pattern[: len(pattern) - len(local_path(pattern))] if scheme_of(pattern) else ""
        return sorted(prefix + match if prefix else match for match in glob.glob(local_path(pattern)))

    def size(self, uri: str) -> int:
        try:
            return os.path.getsize(local_path(uri))
        except OSError as exc:
            raise _error("cannot read the size of", uri, exc) from None

    def makedirs(self, uri: str) -> None:
        os.makedirs(local_path(uri), exist_ok=True)

    def delete(self, uri: str, recursive: bool = False) -> None:
        path = local_path(uri)
        if os.path.isdir(path) and recursive:
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.remove(path)

    def upload(self, local: str, uri: str) -> None:
        target = local_path(uri)
        if os.path.isdir(local):
            shutil.copytree(local, target, dirs_exist_ok=True)
            return
        with self.atomic_file(uri) as staged:
            shutil.copyfile(local, staged)

    def download(self, uri: str, local: str) -> None:
        source = local_path(uri)
        if not os.path.exists(source):
            raise _error("cannot read", uri, FileNotFoundError("it does not exist"))
        if os.path.isdir(source):
            shutil.copytree(source, local, dirs_exist_ok=True)
        else:
            shutil.copyfile(source, local)

    def open_input(self, uri: str) -> BinaryIO:
        try:
            return open(local_path(uri), "rb")
        except OSError as exc:
            raise _error("cannot read", uri, exc) from None

    @contextmanager
    def atomic_file(self, uri: str) -> Iterator[str]:
        """Written beside ``uri`` under a temporary name, then renamed (``os.replace``)."""
        target = local_path(uri)
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        staged = temp_name(target)
        try:
            yield staged
            os.replace(staged, target)
        finally:
            if os.path.exists(staged):
                os.remove(staged)


def _error(what: str, uri: str, exc: OSError) -> StorageError:
    reason = exc.strerror or str(exc)
    return StorageError(f"{what} {uri!r}: {reason}. Check the path and its permissions.")
