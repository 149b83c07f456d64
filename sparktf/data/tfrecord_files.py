"""TFRecord files wherever they are stored: found on the driver, read as records on the executors.

The driver expands paths and globs through :mod:`sparktf.storage` and hands
the executors URIs they can open without the driver's JVM (a Hadoop mount
point resolved to its target). An executor reads a file with TensorFlow's
own ``TFRecordDataset`` when TensorFlow's file system has its scheme (local
files, ``gs://``) and otherwise through fsspec, record by record: the
framing and each length's checksum are checked, the data checksums are not.
"""

from __future__ import annotations

import struct
import threading
from typing import BinaryIO, Dict, Iterator, List, Optional, Sequence, Union

import tensorflow as tf

from sparktf.errors import DataError, StorageError
from sparktf.storage import is_local, local_path, scheme_of, store_for
from sparktf.storage.faults import storage_error, transport_error

__all__ = ["expand_paths", "file_size", "record_dataset", "reads_natively", "read_records", "failed_read"]

_HEADER = struct.Struct("<QI")
_MASK_DELTA = 0xA282EAD8
_FAILED_READS: Dict[str, StorageError] = {}  # path -> the transient failure its last read in this process ended with
_FAILED_LOCK = threading.Lock()


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


def record_dataset(paths: Union[str, tf.Tensor], native: bool) -> tf.data.Dataset:
    """The serialized records of the file(s) ``paths``: ``TFRecordDataset``, or fsspec's bytes when not ``native``."""
    if native:
        return tf.data.TFRecordDataset(paths)
    return tf.data.Dataset.from_generator(_records_of_path, args=(paths,),
                                          output_signature=tf.TensorSpec([], tf.string))


def reads_natively(paths: Sequence[str]) -> bool:
    """True when TensorFlow's own file system opens every one of ``paths``."""
    return all(_tensorflow_reads(path) for path in paths)


def read_records(uri: str) -> Iterator[bytes]:
    """The records of the TFRecord file ``uri``, read through :mod:`sparktf.storage`.

    Raises
    ------
    DataError
        Naming the file and the record, when the file is not a TFRecord file or is cut short.
    StorageError
        When the store fails the read (``transient`` when it broke off or did not answer).
    """
    store = store_for(uri, "TFRecord file")
    with store.open_input(uri) as handle:
        index = 0
        while header := _read(handle, _HEADER.size, uri, store.route):
            length, checksum = _HEADER.unpack(header) if len(header) == _HEADER.size else (0, None)
            if checksum is None or _masked_crc(header[:8]) != checksum:
                raise DataError(f"TFRecord file {uri}: record {index} has no valid header (a truncated file, "
                                "or not a TFRecord file): write it again with tf.io.TFRecordWriter")
            data = _read(handle, length, uri, store.route)
            if len(data) != length or len(_read(handle, 4, uri, store.route)) != 4:
                raise DataError(f"TFRecord file {uri}: record {index} is cut short ({len(data)} of {length} bytes): "
                                "the file is truncated; write it again")
            yield data
            index += 1


def _read(handle: BinaryIO, size: int, uri: str, route: str) -> bytes:
    """``size`` bytes of the open file (fewer at its end); the store's transport errors as ``StorageError``."""
    try:
        return handle.read(size)
    except Exception as exc:  # noqa: BLE001 - only the storage libraries' errors are translated
        if isinstance(exc, OSError) or transport_error(exc):
            raise storage_error("cannot read", uri, route, exc) from exc
        raise


def _records_of_path(path: bytes) -> Iterator[bytes]:
    uri = path.decode("utf-8")
    try:
        yield from read_records(uri)
    except StorageError as exc:  # tf.data keeps only the text of what a generator raised: kept for failed_read
        if exc.transient:
            with _FAILED_LOCK:
                _FAILED_READS[uri] = exc
        raise


def failed_read(paths: Sequence[str]) -> Optional[StorageError]:
    """The transient store failure a read of one of ``paths`` in this process ended with, if any (taken)."""
    with _FAILED_LOCK:
        for path in paths:
            if path in _FAILED_READS:
                return _FAILED_READS.pop(path)
    return None


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


def _crc32c_table() -> List[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def _masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of a few bytes (the length field)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF
