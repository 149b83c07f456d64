"""The staged micro-batches of a resident training job: the stream's log between Spark's commit and training.

``foreachBatch`` stages a micro-batch (:func:`stage_micro_batch`): one Spark
job writes each partition's Blocks to ``<root>/<batchId>/part-<p>.blocks``
from the executors, and the task results (a few numbers each) tell the
records of every file, so no job counts them. The manifest
(``manifest.json``: the query's id, the files and their records) is written
last: a micro-batch is staged once its manifest exists, and a stager killed
before it leaves a folder that the next staging of that ``batchId``
overwrites. The resident job trains staged micro-batches in ``batchId``
order; each is removed once the checkpoint that records it is written, so
what stays staged after a crash is exactly what a restart still has to
train (:func:`staged_batches`).

A rank reads only its contiguous range of a micro-batch's records
(:func:`read_records`), from the files that hold them, through
:mod:`sparktf.storage` (local folders, HDFS, object stores alike). The
records never pass through the JVM's heap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from typing import Any, Dict, Iterator, List, Sequence, Tuple

from sparktf.data.block_serializer import BlockSerializer
from sparktf.data.columnar import Block, block_size, concat_blocks, slice_block
from sparktf.errors import StorageError
from sparktf.spark.jobs import run_job
from sparktf.storage import join, store_for

__all__ = ["StagedBatch", "stage_micro_batch", "staged_batches", "remove_staged", "read_records", "staging_root"]

MANIFEST = "manifest.json"
_WHAT = "the staged micro-batches (model_dir/stream/staged)"


@dataclass(frozen=True)
class StagedBatch:
    """One staged micro-batch.

    Attributes
    ----------
    batch_id : int
        Spark's ``batchId``.
    query_id : str
        The id of the query that staged it.
    folder : str
        Where its files are.
    files : tuple of (str, int)
        Each partition's file and its records, in partition order.
    """

    batch_id: int
    query_id: str
    folder: str
    files: Tuple[Tuple[str, int], ...]

    @property
    def records(self) -> int:
        """The micro-batch's records."""
        return sum(count for _, count in self.files)

    def to_wire(self) -> Dict[str, Any]:
        """As JSON values (the manifest, a resident job's order)."""
        return {"batchId": self.batch_id, "queryId": self.query_id, "folder": self.folder,
                "files": [[path, count] for path, count in self.files]}

    @classmethod
    def from_wire(cls, message: Dict[str, Any]) -> "StagedBatch":
        return cls(int(message["batchId"]), str(message["queryId"]), str(message["folder"]),
                   tuple((str(path), int(count)) for path, count in message["files"]))


def staging_root(model_dir: str) -> str:
    """Where a model's stream stages its micro-batches."""
    return join(model_dir, "stream", "staged")


def _folder(root: str, batch_id: int) -> str:
    return join(root, f"{batch_id:012d}")  # names sort as batch ids


def stage_micro_batch(blocks: Any, root: str, batch_id: int, query_id: str) -> StagedBatch:
    """Write a micro-batch's ``blocks`` (a ``BlockSet``) under ``root`` with one Spark job, the manifest last.

    Raises
    ------
    DataError
        A record the stream's format does not take (its task's own error, naming column, partition and row).
    StorageError
        The store refused a file (naming it).
    """
    folder = _folder(root, batch_id)
    store = store_for(folder, _WHAT)
    store.makedirs(folder)
    written = run_job(blocks.kind, lambda: blocks.collect(partial(_write_partition, store.executor_uri(folder))),
                      what=f"staging micro-batch {batch_id}")
    files = tuple((path, count) for _, path, count in sorted(written) if count)
    staged = StagedBatch(batch_id, query_id, folder, files)
    store.write_bytes(join(folder, MANIFEST), json.dumps(staged.to_wire()).encode())
    return staged


def _write_partition(folder: str, blocks: Iterator[Block]) -> Iterator[Tuple[int, str, int]]:
    """One staging task: its partition's Blocks to one file; ``(partition, path, records)``."""
    from pyspark import TaskContext

    partition = TaskContext.get().partitionId()
    path = join(folder, f"part-{partition:05d}.blocks")
    counted = _Counted(blocks)
    with store_for(path, _WHAT).atomic_file(path) as local, open(local, "wb") as handle:
        BlockSerializer().dump_stream(counted, handle)
    yield partition, path, counted.records


class _Counted:
    """The Blocks of an iterator, counting their records as they go by."""

    def __init__(self, blocks: Iterator[Block]):
        self._blocks = blocks
        self.records = 0

    def __iter__(self) -> Iterator[Block]:
        for block in self._blocks:
            self.records += block_size(block)
            yield block


def staged_batches(root: str) -> List[StagedBatch]:
    """The complete stagings under ``root`` (their manifest written), in ``batchId`` order."""
    store = store_for(root, _WHAT)
    if not store.isdir(root):
        return []
    staged = []
    for name in sorted(store.listdir(root)):
        manifest = join(root, name.rstrip("/").rsplit("/", 1)[-1], MANIFEST)
        if store.exists(manifest):
            staged.append(StagedBatch.from_wire(json.loads(store.read_bytes(manifest))))
    return staged


def remove_staged(staged: StagedBatch) -> None:
    """Delete a trained micro-batch's files (its manifest first, so a half-deleted one is no staging)."""
    store = store_for(staged.folder, _WHAT)
    store.delete(join(staged.folder, MANIFEST))
    store.delete(staged.folder, recursive=True)


def read_records(files: Sequence[Tuple[str, int]], start: int, stop: int) -> Block:
    """Records ``start:stop`` of a staged micro-batch (its ``files``, in order), as one Block.

    Raises
    ------
    StorageError
        A file is missing or shorter than its manifest says.
    """
    parts: List[Block] = []
    offset = 0
    for path, count in files:
        if offset + count > start and offset < stop:
            parts.extend(_file_records(path, max(0, start - offset), min(count, stop - offset)))
        offset += count
    if sum(block_size(part) for part in parts) != stop - start:
        raise StorageError(f"the staged micro-batch's files {[path for path, _ in files]} hold fewer records than "
                           f"their manifest says (records {start}:{stop} asked); delete the folder's manifest to "
                           "drop that staging, or restore its files")
    return concat_blocks(parts)


def _file_records(path: str, start: int, stop: int) -> Iterator[Block]:
    """Records ``start:stop`` of one staged file."""
    offset = 0
    with store_for(path, _WHAT).open_input(path) as handle:
        for block in BlockSerializer().load_stream(handle):
            size = block_size(block)
            if offset + size > start and offset < stop:
                yield slice_block(block, max(0, start - offset), min(size, stop - offset))
            offset += size
            if offset >= stop:
                return
