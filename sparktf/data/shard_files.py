"""A training partition spilled once to the executor's local disk, read back by record ranges.

A training worker writes its partition's Blocks, as they arrive from Spark,
into one raw file per leaf (``tf.string`` leaves: the bytes plus an offset
index; sparse leaves: the non-zeros' values, their column indices and the
records' offsets) in a folder of the executor's local directories
(``SPARK_LOCAL_DIRS``, which Spark deletes when the executor stops). Later
segments and passes read records from these files, memory-mapped, instead of
through the JVM -> Python socket; every Python worker of the executor shares
them. The folder appears complete or not at all (written under a temporary
name, then renamed). TensorFlow-free.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

from sparktf.data.columnar import Block
from sparktf.data.sparse import SparseColumn

__all__ = ["ShardFiles", "spill_directory"]

_META = "meta.json"


def spill_directory(key: str, partition: int) -> str:
    """The folder of partition ``partition`` of the training data ``key`` on this executor."""
    local_dirs = os.environ.get("SPARK_LOCAL_DIRS") or tempfile.gettempdir()
    return os.path.join(local_dirs.split(",")[0], "sparktf-shards", key, f"part-{partition}")


class ShardFiles:
    """The records of one partition on local disk, one memory-mapped file per leaf.

    Create one with :meth:`write` (from Blocks) or :meth:`open` (an earlier
    spill).

    Attributes
    ----------
    directory : str
        The folder holding the files.
    num_records : int
        Records in the partition.
    nbytes : int
        Bytes the records take in memory (string leaves: their bytes and one
        pointer each).
    """

    def __init__(self, directory: str, meta: dict):
        self.directory = directory
        self.num_records = int(meta["num_records"])
        self._leaves = meta["leaves"]
        self._columns = [self._map(index, leaf) for index, leaf in enumerate(self._leaves)]
        self.nbytes = sum(_column_nbytes(column) for column in self._columns)

    @classmethod
    def open(cls, directory: str) -> Optional["ShardFiles"]:
        """The complete spill in ``directory``, or None when there is none."""
        try:
            with open(os.path.join(directory, _META)) as meta:
                return cls(directory, json.load(meta))
        except FileNotFoundError:
            return None

    @classmethod
    def write(cls, directory: str, blocks: Iterable[Block], keyed: bool = False) -> "ShardFiles":
        """Write ``blocks`` (one partition, in order) to ``directory`` and open the result.

        Holds one Block in memory at a time. With ``keyed``, each Block's
        first array is its key (see :func:`~sparktf.data.columnar.keyed_block`)
        and the records are stored in key order (rewritten on disk when they
        arrived in another). When another process completed the same folder
        first, its files are kept and this writer's are dropped.
        """
        parent = os.path.dirname(directory)
        os.makedirs(parent, exist_ok=True)
        scratch = [tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}-", dir=parent)]
        try:
            meta = _write_leaves(scratch[0], blocks, keyed)
            pieces = meta.pop("pieces")
            if pieces != sorted(pieces):  # shuffled pieces: rewrite them in key order, one at a time
                arrived = cls(scratch[0], meta)
                scratch.append(tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}-", dir=parent))
                ordered = (tuple(arrived.read([(start, start + count)])) for *_, start, count in sorted(pieces))
                meta = _write_leaves(scratch[-1], ordered, keyed=False)
                del meta["pieces"], arrived
            with open(os.path.join(scratch[-1], _META), "w") as out:
                json.dump(meta, out)
            try:
                os.rename(scratch[-1], directory)
            except OSError:  # another worker finished the same partition first
                if cls.open(directory) is None:
                    raise
        finally:
            for folder in scratch:
                shutil.rmtree(folder, ignore_errors=True)
        return cls.open(directory)

    def read(self, ranges: Sequence[Tuple[int, int]], buffers: Optional[List[np.ndarray]] = None) -> List[np.ndarray]:
        """The records of ``ranges`` (``[start, stop)`` pairs), concatenated in order, one array per leaf.

        The arrays are copies in process memory: new ones, or views of the
        front of ``buffers`` (from :meth:`buffers`, with room for the
        records), so that streaming allocates nothing per window.
        """
        total = sum(stop - start for start, stop in ranges)
        buffers = buffers or [None] * len(self._columns)
        return [_read_column(column, ranges, total, buffer) for column, buffer in zip(self._columns, buffers)]

    def buffers(self, capacity: int) -> List[Optional[np.ndarray]]:
        """Arrays with room for ``capacity`` records, one per leaf, for :meth:`read` (None for string leaves)."""
        return [None if isinstance(column, (tuple, SparseColumn)) else np.empty((capacity, *column.shape[1:]), column.dtype)
                for column in self._columns]

    def _map(self, index: int, leaf: dict):
        path = os.path.join(self.directory, f"leaf{index}")
        if leaf.get("sparse"):  # offsets (.idx), column indices (.col) and values (.bin) of the non-zeros
            indptr = np.fromfile(path + ".idx", dtype=np.int64)
            nnz = (int(indptr[-1]),)
            return SparseColumn(indptr, _memmap(path + ".col", np.dtype(leaf["sparse"]), nnz),
                                _memmap(path + ".bin", np.dtype(leaf["dtype"]), nnz), leaf["shape"][0])
        if leaf["dtype"] == "object":
            offsets = np.fromfile(path + ".idx", dtype=np.int64)
            data = _memmap(path + ".bin", np.uint8, (int(offsets[-1]),))
            return offsets, data
        return _memmap(path + ".bin", np.dtype(leaf["dtype"]), (self.num_records, *leaf["shape"]))


def _memmap(path: str, dtype: np.dtype, shape: tuple) -> np.ndarray:
    if int(np.prod(shape)) == 0 or dtype.itemsize == 0:
        return np.empty(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=shape)


def _column_nbytes(column) -> int:
    if isinstance(column, tuple):  # strings: their bytes and one object pointer each
        offsets, data = column
        return int(data.nbytes) + 8 * (len(offsets) - 1)
    return int(column.nbytes)


def _read_column(column, ranges: Sequence[Tuple[int, int]], total: int, buffer: Optional[np.ndarray]) -> np.ndarray:
    if isinstance(column, SparseColumn):
        return SparseColumn.concat([column[start:stop] for start, stop in ranges] or [column[:0]])
    if isinstance(column, tuple):
        offsets, data = column
        values = [
            bytes(data[offsets[i] : offsets[i + 1]]) for start, stop in ranges for i in range(start, stop)
        ]
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    out = np.empty((total, *column.shape[1:]), dtype=column.dtype) if buffer is None else buffer[:total]
    filled = 0
    for start, stop in ranges:
        out[filled : filled + stop - start] = column[start:stop]
        filled += stop - start
    return out


def _write_leaves(directory: str, blocks: Iterable[Block], keyed: bool) -> dict:
    """Append the blocks to one file per leaf; the metadata, with ``pieces`` ``[*key, start, count]`` when keyed."""
    files: list = []
    leaves: list = []
    offsets: list = []
    pieces: list = []
    num_records = 0
    try:
        for block in blocks:
            if keyed:
                pieces.append([*block[0].tolist(), num_records, len(block[1])])
                block = block[1:]
            if not files:
                for index, array in enumerate(block):
                    files.append(open(os.path.join(directory, f"leaf{index}.bin"), "wb"))
                    is_object = array.dtype.hasobject
                    leaves.append({"dtype": "object" if is_object else array.dtype.str,
                                   "shape": [] if is_object else list(array.shape[1:])})
                    offsets.append([0] if is_object else None)
                    if isinstance(array, SparseColumn):
                        leaves[-1]["sparse"] = array.indices.dtype.str
                        offsets[-1] = _SparseWriter(os.path.join(directory, f"leaf{index}"))
            for out, array, ends in zip(files, block, offsets):
                if isinstance(ends, _SparseWriter):
                    ends.write(out, array)
                elif ends is None:
                    out.write(memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8)))
                else:
                    for value in array:
                        out.write(value)
                        ends.append(ends[-1] + len(value))
            num_records += len(block[0])
            del block, array  # not held while the next Block arrives
    finally:
        for out in files:
            out.close()
    for index, ends in enumerate(offsets):
        if isinstance(ends, _SparseWriter):
            ends.finish()
        elif ends is not None:
            np.asarray(ends, dtype=np.int64).tofile(os.path.join(directory, f"leaf{index}.idx"))
    return {"num_records": num_records, "leaves": leaves, "pieces": pieces}


class _SparseWriter:
    """Appends a sparse leaf's records: values to its ``.bin`` file, column indices to ``.col``, offsets to ``.idx``."""

    def __init__(self, path: str):
        self.path = path
        self.ends = [np.zeros(1, np.int64)]
        open(path + ".col", "wb").close()

    def write(self, values_file, column: SparseColumn) -> None:
        part = column.compact()
        values_file.write(memoryview(np.ascontiguousarray(part.values).view(np.uint8)))
        with open(self.path + ".col", "ab") as indices:
            indices.write(memoryview(np.ascontiguousarray(part.indices).view(np.uint8)))
        self.ends.append(part.indptr[1:] + self.ends[-1][-1])

    def finish(self) -> None:
        np.concatenate(self.ends).tofile(self.path + ".idx")
