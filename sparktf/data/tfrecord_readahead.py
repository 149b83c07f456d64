"""Read-ahead for the TFRecord files an executor reads through :mod:`sparktf.storage` (fsspec: object stores).

A file is fetched in chunks of :data:`CHUNK_BYTES`, one ranged request each,
by a :class:`ChunkReader` on a thread of its own that stays at most
:data:`AHEAD_CHUNKS` chunks ahead of the records taken: a store's latency
(about 20 ms a request from a cloud VM) is paid while the chunk before is
parsed. The records a chunk completes go to ``tf.data`` as one run (one
Python call per chunk, not per record).

A ``cache=False`` training stream also opens files early: once a reader has
fetched its file's last chunk, the reader of the file that takes its place in
the stream's interleave starts (at a pass's end: the next pass's files, whose
turn comes only after the shuffle buffer has drained), and the stream's
generator for that file takes it over (:func:`file_runs`); a new stream
opens its first files while ``tf.data`` builds its pipeline. At most
:data:`MAX_EARLY` readers wait to be taken in a process (more push the
oldest out), and one nobody takes within :data:`IDLE_SECONDS` stops and
drops its chunks.

Memory: one budget, :data:`READ_AHEAD_BYTES` (64 MiB) of chunks per
process, sets both how many files a training stream reads at once
(:data:`INTERLEAVE_WIDTH`) and how many readers wait opened early
(:data:`MAX_EARLY`): a reader holds at most ``AHEAD_CHUNKS + 2`` chunks
(queued, being fetched, being parsed) and the unparsed part of a record that
spans chunks. On top come the runs ``tf.data`` holds (one chunk's records
per file being read) and any record longer than a chunk.

Every wait is bounded: a reader thread waits for room in its queue only while
its consumer is there (it checks every :data:`POLL_SECONDS`; an early reader
gives up after :data:`IDLE_SECONDS`), and a consumer waits for a chunk at
most :data:`STALL_SECONDS` (the store's own timeouts and retries end a
request first). A failed read reaches the consumer as the ``StorageError``
the store's seam (:mod:`sparktf.storage.faults`) raised.
"""

from __future__ import annotations

import queue
import struct
import threading
import time
from collections import OrderedDict
from functools import partial
from typing import BinaryIO, Callable, Hashable, Iterator, List, Optional, Tuple

from sparktf.errors import DataError, StorageError
from sparktf.process_state import process_cache
from sparktf.storage import store_for
from sparktf.storage.faults import storage_error, transport_error

__all__ = ["CHUNK_BYTES", "AHEAD_CHUNKS", "INTERLEAVE_WIDTH", "MAX_EARLY", "READ_AHEAD_BYTES", "ChunkReader",
           "file_runs", "open_early", "records_of_chunks"]

#: Bytes of one ranged read.
CHUNK_BYTES = 2 << 20
#: Chunks a reader fetches ahead of the consumer.
AHEAD_CHUNKS = 2
#: Bytes of chunks a process's readers hold at most: those of the files a stream reads and those opened early.
READ_AHEAD_BYTES = 64 << 20
#: Readers that budget holds, each at most ``AHEAD_CHUNKS + 2`` chunks (queued, being fetched, being parsed).
_READERS = READ_AHEAD_BYTES // ((AHEAD_CHUNKS + 2) * CHUNK_BYTES)
#: Files a training stream reads at once (its interleave's cycle): half the readers.
INTERLEAVE_WIDTH = _READERS // 2
#: Early-opened readers waiting to be taken, per process: the other half.
MAX_EARLY = _READERS - INTERLEAVE_WIDTH
#: Seconds an early reader waits to be taken before it stops and drops its chunks.
IDLE_SECONDS = 300.0
#: Most seconds a consumer waits for the next chunk (a transient ``StorageError`` then).
STALL_SECONDS = 600.0
#: How often a blocked reader or consumer looks whether the other side has gone.
POLL_SECONDS = 0.1

_HEADER = struct.Struct("<QI")
_MASK_DELTA = 0xA282EAD8
_END = object()


class ChunkReader:
    """The chunks of the file ``uri``, fetched on a thread of its own at most :data:`AHEAD_CHUNKS` ahead.

    Parameters
    ----------
    uri : str
        The file, as :func:`sparktf.storage.store_for` opens it.
    size : int, optional
        Its bytes, when known (the store is not asked); negative: not known.
    early : bool
        Opened before its consumer: stops after :data:`IDLE_SECONDS` unless :meth:`claim` comes first.
    """

    def __init__(self, uri: str, size: Optional[int] = None, early: bool = False):
        self.uri = uri
        self.size = None if size is None or size < 0 else int(size)
        self._queue: "queue.Queue" = queue.Queue(AHEAD_CHUNKS)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._claimed = not early
        self._fetched_all = False
        self._then: Optional[Callable[[], None]] = None
        self._thread = threading.Thread(target=self._fetch, name="sparktf-read-ahead", daemon=True)
        self._thread.start()

    def claim(self, then: Optional[Callable[[], None]] = None) -> bool:
        """Take over an early reader: False when it has stopped; ``then()`` runs once its last chunk is fetched."""
        with self._lock:
            if self._stop.is_set():
                return False
            self._claimed, fetched_all = True, self._fetched_all
            self._then = None if fetched_all else then
        if fetched_all and then is not None:
            then()
        return True

    def chunks(self) -> Iterator[bytes]:
        """The file's chunks in order.

        Raises
        ------
        StorageError
            The store's failure to open or read the file, or no chunk for :data:`STALL_SECONDS` (transient).
        """
        deadline = time.monotonic() + STALL_SECONDS
        while True:
            try:
                item = self._queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if time.monotonic() > deadline or not (self._thread.is_alive() or self._queue.qsize()):
                    raise StorageError(f"cannot read {self.uri!r}: no bytes came for {STALL_SECONDS:g} s, or its "
                                       "reader stopped", path=self.uri, transient=True) from None
                continue
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            deadline = time.monotonic() + STALL_SECONDS
            yield item

    def close(self) -> None:
        """Stop fetching and drop the chunks fetched (the thread ends after the request in flight)."""
        with self._lock:
            self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    def _fetch(self) -> None:
        try:
            store = store_for(self.uri, "TFRecord file")
            with store.open_chunked(self.uri, CHUNK_BYTES, self.size) as handle:
                while True:
                    chunk = read_chunk(handle, CHUNK_BYTES, self.uri, store.route)
                    if chunk and not self._put(chunk):
                        return
                    if len(chunk) < CHUNK_BYTES:
                        break
        except BaseException as exc:  # noqa: BLE001 - the consumer raises it
            self._put(exc)
            return
        with self._lock:
            self._fetched_all, then = True, self._then
        if then is not None:
            then()
        self._put(_END)

    def _put(self, item: object) -> bool:
        """Queue ``item`` once there is room; False when the consumer closed the reader or never came."""
        idle_until = time.monotonic() + IDLE_SECONDS
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=POLL_SECONDS)
                return True
            except queue.Full:
                with self._lock:
                    if not self._claimed and time.monotonic() > idle_until:
                        self._stop.set()
        self.close()
        return False


class _EarlyReaders:
    """The readers opened before their file's turn, by key; at most :data:`MAX_EARLY` (the oldest pushed out)."""

    def __init__(self) -> None:
        self._readers: "OrderedDict[Hashable, ChunkReader]" = OrderedDict()
        self._lock = threading.Lock()

    def start(self, key: Hashable, uri: str, size: Optional[int]) -> None:
        reader = ChunkReader(uri, size, early=True)
        with self._lock:
            replaced = self._readers.pop(key, None)
            pushed_out = [] if replaced is None else [replaced]
            self._readers[key] = reader
            while len(self._readers) > MAX_EARLY:
                pushed_out.append(self._readers.popitem(last=False)[1])
        for old in pushed_out:
            old.close()

    def take(self, key: Hashable, uri: str, size: Optional[int], then: Optional[Callable[[], None]]) -> ChunkReader:
        """The reader started early under ``key``, or a new one; ``then`` as :meth:`ChunkReader.claim` runs it."""
        with self._lock:
            reader = self._readers.pop(key, None)
        if reader is not None and reader.claim(then):
            return reader
        reader = ChunkReader(uri, size)
        reader.claim(then)
        return reader

    def clear(self) -> None:
        """Close every reader waiting to be taken."""
        with self._lock:
            readers, self._readers = list(self._readers.values()), OrderedDict()
        for reader in readers:
            reader.close()


def _early() -> _EarlyReaders:
    return process_cache("early_readers", _EarlyReaders)


def open_early(key: Hashable, uri: str, size: Optional[int] = None) -> None:
    """Start reading the file ``uri`` (``size`` bytes, when known) for the :func:`file_runs` that will ask for
    ``key``."""
    _early().start(key, uri, size)


def file_runs(uri: str, size: Optional[int] = None, key: Optional[Hashable] = None,
              open_next: Optional[Tuple[Hashable, str, Optional[int]]] = None) -> Iterator[List[bytes]]:
    """The records of the TFRecord file ``uri``, a list per chunk, read ahead on a thread.

    Parameters
    ----------
    uri : str
        The file.
    size : int, optional
        Its bytes, when known (negative: not known).
    key : hashable, optional
        The key a reader of this file may have been opened early under (taken over when it was).
    open_next : (key, uri, size), optional
        The file to open early, under that key, once this file's last chunk is fetched.

    Raises
    ------
    DataError
        Naming the file and the record, when the file is not a TFRecord file or is cut short.
    StorageError
        When the store fails the read (``transient`` when it broke off or did not answer).
    """
    reader = _early().take(key, uri, size, None if open_next is None else partial(open_early, *open_next))
    try:
        yield from records_of_chunks(reader.chunks(), uri)
    finally:
        reader.close()


def records_of_chunks(chunks: Iterator[bytes], uri: str) -> Iterator[List[bytes]]:
    """The records of a TFRecord file given as consecutive byte chunks: those each chunk completes.

    The framing and each length's checksum are checked, the data checksums are not.

    Raises
    ------
    DataError
        When a record has no valid header or is cut short (naming ``uri`` and the record).
    """
    pending, index = bytearray(), 0
    for chunk in chunks:
        pending += chunk
        run, offset = [], 0
        with memoryview(pending) as view:
            while len(view) - offset >= _HEADER.size:
                length, checksum = _HEADER.unpack_from(view, offset)
                if _masked_crc(view[offset:offset + 8]) != checksum:
                    raise _no_header(uri, index + len(run))
                end = offset + _HEADER.size + length + 4
                if end > len(view):
                    break
                run.append(view[offset + _HEADER.size:end - 4].tobytes())
                offset = end
        del pending[:offset]
        if run:
            index += len(run)
            yield run
    if len(pending) >= _HEADER.size:
        have = min(_HEADER.unpack_from(pending)[0], len(pending) - _HEADER.size)
        raise DataError(f"TFRecord file {uri}: record {index} is cut short ({have} of "
                        f"{_HEADER.unpack_from(pending)[0]} bytes): the file is truncated; write it again")
    if pending:
        raise _no_header(uri, index)


def read_chunk(handle: BinaryIO, size: int, uri: str, route: str) -> bytes:
    """``size`` bytes of the open file (fewer at its end); the store's transport errors as ``StorageError``."""
    try:
        return handle.read(size)
    except Exception as exc:  # noqa: BLE001 - only the storage libraries' errors are translated
        if isinstance(exc, OSError) or transport_error(exc):
            raise storage_error("cannot read", uri, route, exc) from exc
        raise


def _no_header(uri: str, index: int) -> DataError:
    return DataError(f"TFRecord file {uri}: record {index} has no valid header (a truncated file, or not a TFRecord "
                     "file): write it again with tf.io.TFRecordWriter")


def _crc32c_table() -> List[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def _masked_crc(data: memoryview) -> int:
    """TFRecord's masked CRC-32C of a few bytes (the length field)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF
