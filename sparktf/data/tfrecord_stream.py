"""TFRecord files read by the training workers every epoch with ``tf.data`` (``from_tfrecord_file(cache=False)``).

Nothing is cached by Spark: the driver counts the records of each file (one
small job, no parsing), assigns whole files to the workers so that their
record counts are as even as it can make them, and every worker streams its
files pass after pass: the file order reshuffled per pass, reads interleaved,
a shuffle buffer of raw records (sized from ``spark.sparktf.trainDataMemory``),
``parse_fn`` mapped in parallel (``AUTOTUNE``), batches of exactly the local
batch, prefetched. ``parse_fn`` therefore runs on every record every epoch,
with fresh randomness each time. The stream is seekable: batch ``k`` starts
at record ``k * local_batch`` of the worker's endless stream, so a relaunch or
resume starts there without parsing what came before.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
import uuid
from functools import partial
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from sparktf.data import specs
from sparktf.data.block_feed import FeedStream
from sparktf.data.columnar import RecordFormat
from sparktf.data.sources import item_partitions
from sparktf.data.tfrecord_io import load_parse_fn
from sparktf.data.tfrecord_files import ReadFailures, file_size, record_dataset, reads_natively
from sparktf.data.tfrecord_readahead import INTERLEAVE_WIDTH, open_early
from sparktf.data.sample_weights import check_weights
from sparktf.errors import DataError, SparkTFError, StorageError
from sparktf.process_state import process_cache
from sparktf.spark.task_devices import GpuPlan, gpu_plan, prepare_tensorflow_task
from sparktf.spark.user_code import pickle_by_value

__all__ = ["TFRecordStream", "TFRecordFeed", "assign_files"]

#: Most raw records in a worker's shuffle buffer (the memory budget may allow fewer).
MAX_SHUFFLE_BUFFER = 10_000
_SEED_STRIDE = 1_000_003
# What TensorFlow's own readers (gs://) raise when the store breaks off or does not answer.
_STORE_FAILURES = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError)


def assign_files(counts: Sequence[int], num_workers: int) -> List[List[int]]:
    """File indices per worker: largest files first, each to the worker with the fewest records so far.

    Raises
    ------
    DataError
        If there are fewer files than workers.
    """
    if len(counts) < num_workers:
        raise DataError(
            f"from_tfrecord_file(cache=False) gives each training worker whole files, but there are "
            f"{len(counts)} files for {num_workers} workers: write the data into at least "
            f"{num_workers} files, use fewer workers, or cache=True"
        )
    loads = [0] * num_workers
    files: List[List[int]] = [[] for _ in range(num_workers)]
    for index in sorted(range(len(counts)), key=lambda i: (-counts[i], i)):
        worker = min(range(num_workers), key=lambda w: (loads[w], w))
        files[worker].append(index)
        loads[worker] += counts[index]
    return [sorted(indices) for indices in files]


class TFRecordStream:
    """The driver's side: the files, ``parse_fn`` and the record format of a ``cache=False`` dataset.

    Parameters
    ----------
    files : list of str
        TFRecord files, in order.
    parse_fn : callable
        The user's ``parse_fn``.
    record_format : RecordFormat
        The format traced from ``parse_fn``.
    """

    def __init__(self, files: List[str], parse_fn: Callable, record_format: RecordFormat):
        self.files = files
        self.parse_fn_bytes = pickle_by_value({"parse_fn": parse_fn})
        self.record_format = record_format

    def count_records(self, session: Any) -> List[int]:
        """Records per file, counted on the executors without parsing them (``session``: the SessionKind)."""
        return item_partitions(session, self.files).collect(partial(_count_files, gpu_plan(session.conf)))

    def training_input(self, blocks: Any, counts: Sequence[int], num_workers: int, shuffle: bool, seed: int,
                       memory_budget: int) -> Tuple[Any, "TFRecordFeed"]:
        """``(placeholder, feed)`` for a training job: one tiny partition per worker (``blocks.placeholder``), and
        the feed that reads its files."""
        assignment = assign_files(counts, num_workers)
        sizes = [file_size(path) for path in self.files]
        record_bytes = max(1, sum(sizes) // max(1, sum(counts)))
        buffer = int(min(MAX_SHUFFLE_BUFFER, max(1, memory_budget // 2 // record_bytes)))
        feed = TFRecordFeed(
            files=[[self.files[i] for i in indices] for indices in assignment],
            counts=[sum(counts[i] for i in indices) for indices in assignment],
            parse_fn_bytes=self.parse_fn_bytes,
            record_format=self.record_format,
            shuffle=shuffle,
            seed=seed,
            shuffle_buffer=buffer,
            sizes=[[sizes[i] for i in indices] for indices in assignment],
        )
        return blocks.placeholder(num_workers), feed


class TFRecordFeed:
    """Picklable: how training worker ``rank`` streams its files (see the module docstring).

    Parameters
    ----------
    files : list of list of str
        The files of each rank.
    counts : list of int
        The records of each rank.
    parse_fn_bytes : bytes
        ``parse_fn`` pickled by value.
    record_format : RecordFormat
    shuffle : bool
        Reshuffle files and records every pass.
    seed : int
    shuffle_buffer : int
        Raw records in the shuffle buffer.
    sizes : list of list of int, optional
        The bytes of each rank's files, when known: a reader through the store then opens a file without
        asking for its size (one request less per file and pass).
    """

    def __init__(self, files: List[List[str]], counts: List[int], parse_fn_bytes: bytes,
                 record_format: RecordFormat, shuffle: bool, seed: int, shuffle_buffer: int,
                 sizes: Optional[List[List[int]]] = None):
        self.files = files
        self.sizes = sizes or [[-1] * len(paths) for paths in files]
        self.counts = counts
        self.parse_fn_bytes = parse_fn_bytes
        self.record_format = record_format
        self.shuffle = shuffle
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.identity = hashlib.sha256(pickle.dumps(
            (files, counts, parse_fn_bytes, shuffle, seed, shuffle_buffer))).hexdigest()

    #: Any task may read any rank's files: a rank takes the shard whose stream its process holds open.
    moves_shards = True

    def ready_shard(self, local_batches: Sequence[int], start_batch: int) -> Optional[int]:
        """The rank whose stream this process has parked at ``start_batch`` (a previous segment's), if any.

        Any task may read any rank's files, so a task that finds its
        process holding rank ``r``'s stream open offers to take ``r``'s
        place in the data (see :func:`~sparktf.data.block_feed.shards_for_claims`).
        """
        key = _parked().key_at(start_batch)  # (identity, rank, local batch), as open() parks it
        if key is None or key[0] != self.identity:
            return None
        _, rank, local_batch = key
        return rank if rank < len(local_batches) and local_batches[rank] == local_batch else None

    def open(self, rank: int, blocks: Iterable[Any], local_batch: int, start_batch: int) -> FeedStream:
        """Batches of rank ``rank`` from batch ``start_batch`` on (``blocks``, the task's placeholder, is read and
        dropped)."""
        for _ in blocks:
            pass
        records = self.counts[rank]
        if records == 0:
            raise DataError(
                f"training worker rank {rank} got no records: its TFRecord files {self.files[rank]} are "
                "empty; write the data into more even files or use fewer workers"
            )
        key = (self.identity, rank, local_batch)
        parked = _parked().pop(key, start_batch)
        if parked is None:
            first = start_batch * local_batch
            failures = ReadFailures()
            parked = self._batches(rank, self._dataset(rank, first // records, first % records, local_batch, failures),
                                   failures)
        return FeedStream(parked, park=lambda next_batch, batches: _parked().put(key, next_batch, batches),
                          start_batch=start_batch)

    def _dataset(self, rank: int, first_pass: int, skip: int, local_batch: int,
                 failures: ReadFailures) -> tf.data.Dataset:
        parse_fn = load_parse_fn(self.parse_fn_bytes)
        files, sizes = tf.constant(self.files[rank]), tf.constant(self.sizes[rank], tf.int64)
        count = len(self.files[rank])
        cycle = min(count, INTERLEAVE_WIDTH)
        seed, shuffle, buffer = self.seed, self.shuffle, self.shuffle_buffer
        native = reads_natively(self.files[rank])
        name = uuid.uuid4().hex  # names this pipeline's early-opened readers in the process

        def pass_seed(pass_number: tf.Tensor) -> tf.Tensor:
            return tf.cast(rank * _SEED_STRIDE, tf.int64) + pass_number

        def order_of(pass_number: tf.Tensor) -> tf.Tensor:
            """The indices of the files in the pass's order."""
            indices = tf.range(count, dtype=tf.int64)
            if not shuffle:
                return indices
            return tf.random.experimental.stateless_shuffle(
                indices, seed=tf.stack([tf.constant(seed, tf.int64), pass_seed(pass_number)]))

        def one_pass(pass_number: tf.Tensor) -> tf.data.Dataset:
            # the shuffles' seeds are ours alone; and TensorFlow's seed helper compares (global seed, op seed)
            # with (0, 0), which fails on a tensor op seed when the process's global seed is 0
            # (keras.utils.set_random_seed(0)): this pass's graph takes none
            tf.compat.v1.get_default_graph().seed = None
            order = order_of(pass_number)
            # the file that takes each file's place in the interleave (the next pass's, at the end): read early
            following = tf.concat([order, order_of(pass_number + 1)], 0)[cycle:cycle + count]
            following_pass = pass_number + tf.cast(tf.range(cycle, cycle + count) >= count, tf.int64)
            slices = (tf.gather(files, order), tf.gather(sizes, order), tf.gather(files, following),
                      tf.gather(sizes, following), following_pass)
            records = tf.data.Dataset.from_tensor_slices(slices).interleave(
                lambda path, size, next_path, next_size, next_pass: record_dataset(
                    path, native, (size, name, pass_number, next_path, next_size, next_pass), failures),
                cycle_length=cycle, num_parallel_calls=cycle, deterministic=True)
            return records.shuffle(buffer, seed=seed * _SEED_STRIDE + pass_seed(pass_number)) if shuffle else records

        if not native:  # the first files are read while the pipeline is built
            for index in order_of(tf.constant(first_pass, tf.int64)).numpy()[:cycle]:
                path = self.files[rank][index]
                open_early((name.encode(), path, first_pass), path, self.sizes[rank][index])
        stream = tf.data.Dataset.range(first_pass, 1 << 62).flat_map(one_pass).skip(skip)
        stream = stream.map(parse_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return stream.batch(local_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

    def _batches(self, rank: int, dataset: tf.data.Dataset, failures: ReadFailures) -> Iterator[List[tf.Tensor]]:
        """The batches as tensors, one per leaf (already of the traced specs: no NumPy round trip); a failed read
        raises the ``StorageError`` the store raised, kept in ``failures``."""
        iterator = iter(dataset)
        while True:
            try:
                element = next(iterator)
            except tf.errors.OpError as exc:
                raise _read_error(rank, self.files[rank], exc, failures.take()) from None
            leaves = specs.flatten(self.record_format.as_element(element))
            if self.record_format.has_weights:  # records of shuffled files: the rank's files are named
                check_weights(leaves[-1], lambda i: f"a record that training worker rank {rank} read from "
                                                    f"{self.files[rank]}")
            yield leaves


class _ParkedStream:
    """The batches a finished segment left open in this process, for the next segment of the same rank.

    A segment ends after its last batch; the next one on the same Python
    worker usually wants exactly the following batch, and continuing the
    open ``tf.data`` pipeline spares rebuilding and refilling it. One stream
    is kept; any other is closed on a thread of its own (winding down a busy
    pipeline took up to 2 s under load).
    """

    def __init__(self) -> None:
        self._parked: Optional[Tuple[Any, int, Iterator]] = None
        self._lock = threading.Lock()

    def put(self, key: Any, next_batch: int, batches: Iterator) -> None:
        with self._lock:
            self._drop_parked()
            self._parked = (key, next_batch, batches)

    def key_at(self, start_batch: int) -> Optional[Any]:
        """The key of the parked batches when they are positioned at ``start_batch``; else None."""
        with self._lock:
            parked = self._parked
            return parked[0] if parked is not None and parked[1] == start_batch else None

    def pop(self, key: Any, start_batch: int) -> Optional[Iterator]:
        """The parked batches when they are ``key``'s, positioned at ``start_batch``; else None."""
        with self._lock:
            parked, self._parked = self._parked, None
            if parked is not None and parked[:2] == (key, start_batch):
                return parked[2]
            if parked is not None:
                self._parked = parked
                self._drop_parked()
            return None

    def _drop_parked(self) -> None:
        if self._parked is not None:
            threading.Thread(target=_close, args=(self._parked[2],), name="sparktf-tf-data-close",
                             daemon=True).start()
            self._parked = None

    def clear(self) -> None:
        with self._lock:
            self._drop_parked()


def _close(batches: Iterator) -> None:
    batches.close()


def _parked() -> _ParkedStream:
    return process_cache("parked_stream", _ParkedStream)


def _read_error(rank: int, files: List[str], exc: tf.errors.OpError,
                store_failure: Optional[StorageError]) -> SparkTFError:
    """A ``DataError`` (relaunching cannot help), or a ``StorageError`` (a task failure, relaunched when transient).

    ``store_failure``: what a read through the store raised, if one failed (``tf.data`` kept only its text).
    """
    message = " ".join(exc.message.split())
    named = [path for path in files if path in message]
    where = f"TFRecord file {named[0]}" if named else f"one of the TFRecord files {files}"
    if store_failure is not None or isinstance(exc, _STORE_FAILURES):
        failure = store_failure or StorageError(f"cannot read {where}: {message[:400]}", transient=True)
        relaunched = ", a task failure that training relaunches" if failure.transient else ""
        return StorageError(f"training worker rank {rank} could not read its TFRecord files mid-epoch{relaunched}: "
                            f"{failure}", path=failure.path, route=failure.route, retries=failure.retries,
                            transient=failure.transient)
    return DataError(
        f"training worker rank {rank}: reading or parsing {where} failed: {message[:400]}. "
        "Check that the file exists and is readable on every executor and that parse_fn accepts its records"
    )


def _count_files(gpus: GpuPlan, paths: Iterable[str]) -> Iterator[int]:
    prepare_tensorflow_task(gpus)
    for path in paths:
        try:
            yield int(record_dataset(path, reads_natively([path])).reduce(np.int64(0), lambda count, _: count + 1))
        except tf.errors.OpError as exc:
            message = " ".join(exc.message.split())[:400]
            raise DataError(f"TFRecord file {path} could not be counted: {message}") from None

