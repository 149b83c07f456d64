"""TFRecord files wherever they are stored: found on the driver, read as records on the executors.

The driver expands paths and globs through :mod:`sparktf.storage` and hands
the executors URIs they can open without the driver's JVM (a Hadoop mount
point resolved to its target). An executor reads a file with TensorFlow's
own ``TFRecordDataset`` when TensorFlow's file system has its scheme (local
files, ``gs://``) and otherwise through fsspec, in chunks read ahead on a
thread (:mod:`~sparktf.data.tfrecord_readahead`): the framing and each
length's checksum are checked, the data checksums are not.
"""

from __future__ import annotations

import functools
import threading
from typing import Iterator, List, Optional, Sequence, Union

import tensorflow as tf

from sparktf.data.tfrecord_readahead import file_runs
from sparktf.errors import DataError, StorageError
from sparktf.storage import is_local, local_path, scheme_of, store_for

__all__ = ["expand_paths", "file_size", "record_dataset", "reads_natively", "ReadFailures"]


class ReadFailures:
    """The store failures of one stream's reads, as they were raised.

    ``tf.data`` hands on only the text of what a generator raised; the
    stream that owns the reads takes the ``StorageError`` itself from here
    (its path, route and whether it is transient), for the reads it made.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first: Optional[StorageError] = None

    def record(self, error: StorageError) -> None:
        """Keep ``error`` unless an earlier failure is kept (the first is the cause)."""
        with self._lock:
            self._first = self._first or error

    def take(self) -> Optional[StorageError]:
        """The first failure kept since the last call, if any."""
        with self._lock:
            first, self._first = self._first, None
            return first


def expand_paths(paths: Union[str, Sequence[str]]) -> List[str]:
    """The files named by ``paths`` (a file, a glob, or a list of them), globs sorted, as executors open them.

    Raises
    ------
    DataError
        If a path or glob matches no file.
    StorageError
        If nothing can open a path's scheme, on the driver or on the executors.
    """
    patterns = [paths] if isinstance(paths, str) else list(paths)
    if not patterns:
        raise DataError("no TFRecord paths given: pass a file, a glob or a list of them")
    files: List[str] = []
    for pattern in patterns:
        store = store_for(pattern, "TFRecord path")
        matches = [match for match in store.glob(pattern) if not store.isdir(match)]
        if not matches:
            raise DataError(f"TFRecord path {pattern!r} matches no file ({store.route})")
        for match in matches:
            uri = store.executor_uri(match)
            uri = local_path(uri) if is_local(uri) else uri
            if uri not in files:
                files.append(uri)
    for uri in files:
        if not _tensorflow_reads(uri):
            _check_fsspec_opens(uri)
    return files


def file_size(path: str) -> int:
    """Bytes of the TFRecord file ``path``."""
    return store_for(path, "TFRecord path").size(path)


def record_dataset(paths: Union[str, tf.Tensor], native: bool, stream: Sequence[tf.Tensor] = (),
                   failures: Optional[ReadFailures] = None) -> tf.data.Dataset:
    """The serialized records of the file(s) ``paths``: ``TFRecordDataset``, or read through
    :mod:`sparktf.storage` with read-ahead when not ``native``.

    Parameters
    ----------
    paths : str or tf.Tensor
        One file when not ``native``.
    native : bool
        TensorFlow's file system opens ``paths``.
    stream : sequence of tf.Tensor
        For a ``cache=False`` stream read through the store: this file's bytes, the stream's name, this file's
        pass, and the file, its bytes and its pass to open early once this one's last chunk is fetched (ignored
        when ``native``).
    failures : ReadFailures, optional
        Where a read through the store keeps the ``StorageError`` it ended with.
    """
    if native:
        return tf.data.TFRecordDataset(paths)
    return tf.data.Dataset.from_generator(functools.partial(_records_of_path, failures=failures), args=(paths, *stream),
                                          output_signature=tf.TensorSpec([None], tf.string)).unbatch()


def reads_natively(paths: Sequence[str]) -> bool:
    """True when TensorFlow's own file system opens every one of ``paths``."""
    return all(_tensorflow_reads(path) for path in paths)


def _records_of_path(path: bytes, size: int = -1, stream: bytes = b"", pass_number: int = 0, next_path: bytes = b"",
                     next_size: int = -1, next_pass: int = 0, failures: Optional[ReadFailures] = None,
                     ) -> Iterator[List[bytes]]:
    """The records of one file, a list per chunk read (see :mod:`~sparktf.data.tfrecord_readahead`).

    ``size``: the file's bytes (-1: unknown). A ``cache=False`` stream names itself (``stream``): the file of
    pass ``pass_number`` is then taken over from the reader opened early for it, and ``next_path`` of pass
    ``next_pass`` is opened early once this file's last chunk is fetched.
    """
    uri = path.decode("utf-8")
    key = open_next = None
    if stream:
        following = next_path.decode("utf-8")
        key = (stream, uri, int(pass_number))
        open_next = ((stream, following, int(next_pass)), following, int(next_size))
    try:
        yield from file_runs(uri, int(size), key, open_next)
    except StorageError as exc:  # tf.data keeps only the text of what a generator raised
        if failures is not None:
            failures.record(exc)
        raise


def _tensorflow_reads(path: str) -> bool:
    return is_local(path) or scheme_of(path) in set(tf.io.gfile.get_registered_schemes()) - {"ram"}


def _check_fsspec_opens(uri: str) -> None:
    import fsspec

    scheme = scheme_of(uri)
    try:
        fsspec.get_filesystem_class(scheme)
    except (ImportError, ValueError) as exc:
        raise StorageError(
            f"the executors cannot read TFRecord file {uri!r}: they read files through TensorFlow or fsspec, "
            f"and neither opens scheme {scheme!r} here ({exc}). Install the scheme's fsspec package "
            "(sparktf[s3], [gcs], [azure]) on the executors, or copy the files to storage they can read"
        ) from None
