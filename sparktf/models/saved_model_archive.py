"""A SavedModel directory packed as deterministic tar bytes, for broadcasting to executors."""

from __future__ import annotations

import atexit
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from typing import Any, List

from sparktf.errors import DataError

__all__ = ["SavedModelArchive", "load_saved_model"]


@dataclass(frozen=True)
class SavedModelArchive:
    """A SavedModel directory packed as tar bytes, for broadcasting.

    Attributes
    ----------
    data : bytes
        An uncompressed tar of the directory's files (sorted, zero mtimes, so
        equal directories give equal bytes).
    key : str
        Hex SHA-256 of ``data``.
    """

    data: bytes
    key: str

    @classmethod
    def from_directory(cls, path: str) -> "SavedModelArchive":
        """Pack the SavedModel directory ``path``.

        Raises
        ------
        DataError
            When ``path`` holds no ``saved_model.pb``.
        """
        if not os.path.isfile(os.path.join(path, "saved_model.pb")):
            raise DataError(
                f"{path!r} is not a SavedModel directory (no saved_model.pb in it). Pass the "
                "directory written by tf.saved_model.save() or model.export()."
            )
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for name in _sorted_files(path):
                info = archive.gettarinfo(os.path.join(path, name), arcname=name)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(os.path.join(path, name), "rb") as handle:
                    archive.addfile(info, handle)
        data = buffer.getvalue()
        return cls(data=data, key=hashlib.sha256(data).hexdigest())

    def extract(self) -> str:
        """Unpack into a new temporary directory (removed at process exit); return its path."""
        target = tempfile.mkdtemp(prefix=f"sparktf-savedmodel-{self.key[:12]}-")
        atexit.register(shutil.rmtree, target, ignore_errors=True)
        with tarfile.open(fileobj=io.BytesIO(self.data), mode="r") as archive:
            archive.extractall(target, filter="data")
        return target

    def load(self) -> Any:
        """``tf.saved_model.load`` of the unpacked directory."""
        return load_saved_model(self.extract())


def load_saved_model(path: str) -> Any:
    """``tf.saved_model.load(path)``, with a ``DataError`` naming the file when it cannot be read.

    Raises
    ------
    DataError
        When ``saved_model.pb`` (or the variables) is corrupt or unreadable.
    """
    import tensorflow as tf

    try:
        return tf.saved_model.load(path)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(
            f"cannot load the SavedModel in {path!r}: {first[:300]}. The directory (its saved_model.pb "
            "or variables/) is corrupt or incomplete: write it again with tf.saved_model.save() or "
            "model.export()."
        ) from exc


def _sorted_files(root: str) -> List[str]:
    names = []
    for directory, _, files in os.walk(root):
        names.extend(os.path.relpath(os.path.join(directory, f), root) for f in files)
    return sorted(names)
