"""Endless training batches of one worker, in memory or streamed through a bounded shuffle window.

A worker's records come from a *record source* (:class:`~sparktf.data.batching.Shard`
in memory, or :class:`~sparktf.data.shard_files.ShardFiles` on local disk): anything
with ``num_records`` and ``read(ranges)``. :class:`TrainBatches` cuts the
source's records into batches of exactly ``local_batch`` records, pass after
pass, and never a short batch: a batch that runs past the end of a pass
continues with the next one.

Each pass is a list of *windows*: record ranges read together, and the order
in which their records are used.

* ``window_records >= num_records`` (the shard fits the memory budget): one
  window, the whole shard, read once; with ``shuffle`` every pass is a new
  permutation of all records.
* otherwise (streamed): the shard is cut into chunks of
  ``window_records // CHUNKS_PER_WINDOW`` records; with ``shuffle`` the chunk
  order is reshuffled every pass and the records of each window (a run of
  chunks) are shuffled inside it; a background thread reads the next window
  while the current one is used, and at most two windows are in memory.

Without ``shuffle`` records come in shard order, from record 0 when
``sequential_order`` and from a seeded offset otherwise, identical in both
modes. All randomness derives from ``(seed, rank, pass[, window])``, and the
stream can start at any batch (``start_batch``) without reading the ones
before it: a relaunch or a resume continues the stream of an uninterrupted
run. TensorFlow-free.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from sparktf.data.sparse import concat_columns, take_rows
from sparktf.errors import DataError, TrainingError

__all__ = ["TrainBatches", "CHUNKS_PER_WINDOW"]

#: A streamed window holds this many chunks (shuffled as units across the pass).
CHUNKS_PER_WINDOW = 16
#: Seconds the step waits for the reader thread's next window before giving up.
_WINDOW_WAIT = 600.0


@dataclass
class _Window:
    """Records ``ranges`` of the source, used in ``order`` (indices into their concatenation; None: as read)."""

    ranges: List[Tuple[int, int]]
    order: Optional[np.ndarray]

    @property
    def size(self) -> int:
        return sum(stop - start for start, stop in self.ranges)


class TrainBatches:
    """Endless training batches of exactly ``local_batch`` records from a record source.

    Parameters
    ----------
    source : Shard or ShardFiles
        The worker's records (``num_records``, ``read(ranges)``).
    local_batch : int
        Records per batch.
    shuffle : bool
        Reshuffle for every pass.
    seed : int
        Seed of the dataset.
    rank : int
        The worker's rank; part of the random stream.
    sequential_order : bool
        Without ``shuffle``, start at record 0 instead of a seeded offset.
    window_records : int, optional
        Most records read into memory at once (two windows may be); None or
        at least ``num_records``: the whole source, read once.
    start_batch : int
        Index of the first batch to produce (0: the stream's beginning).

    Raises
    ------
    DataError
        If the source is empty or ``local_batch`` is not positive.
    """

    def __init__(
        self,
        source: Any,
        local_batch: int,
        shuffle: bool,
        seed: int,
        rank: int,
        sequential_order: bool = False,
        window_records: Optional[int] = None,
        start_batch: int = 0,
    ):
        if source.num_records == 0:
            raise DataError(
                f"training worker rank {rank} got no records: use a dataset with at least one "
                "record per training worker, or fewer workers"
            )
        if local_batch <= 0:
            raise DataError(f"the local batch size must be positive, got {local_batch}")
        self.source = source
        self.local_batch = local_batch
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.sequential_order = sequential_order
        n = source.num_records
        self.streamed = window_records is not None and window_records < n
        self.window_records = max(1, window_records) if self.streamed else n
        self.chunk_records = max(1, self.window_records // CHUNKS_PER_WINDOW)
        first = start_batch * local_batch
        self.passes = first // n  # passes started so far (the current one included, once it starts)
        self._windows = self._window_stream(first // n, first % n)
        self._reader = _WindowReader(source, self._windows, self.window_records) if self.streamed else None
        self._arrays: List[np.ndarray] = []
        self._order: np.ndarray = np.empty(0, np.int64)
        self._position = 0

    def __iter__(self) -> "TrainBatches":
        return self

    def __next__(self) -> List[np.ndarray]:
        pieces: List[List[np.ndarray]] = []
        needed = self.local_batch
        while needed:
            if self._position == len(self._order):
                self._next_window()
            take = min(needed, len(self._order) - self._position)
            indices = self._order[self._position : self._position + take]
            pieces.append([take_rows(array, indices) for array in self._arrays])
            self._position += take
            needed -= take
        if len(pieces) == 1:
            return pieces[0]
        return [concat_columns(columns) for columns in zip(*pieces)]

    def close(self) -> None:
        """Stop the reader thread (streamed mode); the batches end."""
        if self._reader is not None:
            self._reader.close()

    # ------------------------------------------------------------------ windows

    def _next_window(self) -> None:
        if self._reader is not None:
            self._arrays = []  # let go of the used window before the reader fills its slot
            window, arrays, skip = self._reader.next()
        else:
            window, skip = next(self._windows)
            arrays = self._arrays if self._arrays else self.source.read(window.ranges)
        self._arrays = arrays
        self._order = window.order if window.order is not None else np.arange(window.size)
        self._position = skip

    def _window_stream(self, first_pass: int, skip: int) -> Iterator[Tuple[_Window, int]]:
        """``(window, records to skip in it)`` from pass ``first_pass`` on, forever."""
        pass_number = first_pass
        while True:
            self.passes = pass_number + 1
            for window in self._pass_windows(pass_number):
                if skip >= window.size:
                    skip -= window.size
                    continue
                yield window, skip
                skip = 0
            pass_number += 1

    def _pass_windows(self, pass_number: int) -> List[_Window]:
        n = self.source.num_records
        rng = self._rng(pass_number)
        if not self.streamed:
            if self.shuffle:
                order = rng.permutation(n)
            elif self.sequential_order:
                order = None
            else:
                order = np.roll(np.arange(n), -self._offset())
            return [_Window([(0, n)], order)]
        if self.shuffle:
            chunks = [(s, min(s + self.chunk_records, n)) for s in range(0, n, self.chunk_records)]
            chunks = [chunks[i] for i in rng.permutation(len(chunks))]
            per_window = max(1, self.window_records // self.chunk_records)
            windows = []
            for w, first in enumerate(range(0, len(chunks), per_window)):
                ranges = chunks[first : first + per_window]
                size = sum(stop - start for start, stop in ranges)
                order = np.random.default_rng([self.seed, self.rank, pass_number, w + 1]).permutation(size)
                windows.append(_Window(ranges, order))
            return windows
        offset = 0 if self.sequential_order else self._offset()
        spans = [(offset, n), (0, offset)] if offset else [(0, n)]
        return [_Window(ranges, None) for ranges in _split_spans(spans, self.window_records)]

    def _offset(self) -> int:
        return int(self._rng(0).integers(self.source.num_records))

    def _rng(self, pass_number: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.rank, pass_number])


def _split_spans(spans: Sequence[Tuple[int, int]], size: int) -> List[List[Tuple[int, int]]]:
    """Consecutive record spans cut into windows of ``size`` records (the last may be shorter)."""
    windows: List[List[Tuple[int, int]]] = [[]]
    room = size
    for start, stop in spans:
        while start < stop:
            if room == 0:
                windows.append([])
                room = size
            take = min(room, stop - start)
            windows[-1].append((start, start + take))
            start += take
            room -= take
    return windows


class _WindowReader:
    """Reads the next windows on a background thread into two buffers: the window in use and the next one."""

    def __init__(self, source: Any, windows: Iterator[Tuple[_Window, int]], capacity: int):
        self._source = source
        self._capacity = capacity
        self._windows = windows
        self._slots = threading.Semaphore(2)
        self._ready: "queue.Queue" = queue.Queue()
        self._closed = threading.Event()
        self._held = False
        self._thread = threading.Thread(target=self._run, name="sparktf-window-reader", daemon=True)
        self._thread.start()

    def next(self) -> Tuple[_Window, List[np.ndarray], int]:
        if self._held:  # the caller is done with its current window: let the reader fill the slot
            self._slots.release()
        try:
            item = self._ready.get(timeout=_WINDOW_WAIT)
        except queue.Empty:
            raise TrainingError(
                f"the training data reader thread delivered no window in {_WINDOW_WAIT:.0f} s; "
                "is the executor's local disk (SPARK_LOCAL_DIRS) stalled?"
            ) from None
        if isinstance(item, BaseException):
            raise item
        self._held = True
        return item

    def close(self) -> None:
        self._closed.set()
        self._slots.release()
        self._slots.release()
        self._thread.join(timeout=_WINDOW_WAIT)

    def _run(self) -> None:
        try:
            buffers = [self._source.buffers(self._capacity) for _ in range(2)]
            for number, (window, skip) in enumerate(self._windows):
                self._slots.acquire()  # the window read two windows ago is no longer used
                if self._closed.is_set():
                    return
                self._ready.put((window, self._source.read(window.ranges, buffers[number % 2]), skip))
        except BaseException as error:  # handed to the consumer, which raises it
            self._ready.put(error)
