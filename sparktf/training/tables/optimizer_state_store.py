"""Where the sharded tables' optimizer state lives between segments: files the ranks write and read, never the
driver's memory.

At a segment's end every rank writes its rows of each sharded table's optimizer state
to ``<root>/slots-<iteration>-<launch>/<layer>/<kind>.<start>-<end>.npy``
through :mod:`sparktf.storage`; once every rank has, rank 0 writes the
folder's manifest (``manifest.json``: the iteration and every piece written),
so a folder without one is one whose segment did not finish. The next
segment's ranks read the rows they own from the pieces the manifest lists
whose rows overlap them, whatever the number of ranks that wrote them
(resuming on another number of workers re-shards here). ``root``
is ``model_dir/tables``, or a temporary folder on the driver's disk when the
executors share that disk (a local master). A checkpoint names the folder of
its iteration; the driver deletes the folders no checkpoint and no segment
needs any more (:func:`prune_optimizer_state_folders`).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from sparktf.errors import ConfigurationError, StorageError
from sparktf.storage import join, local_copy, store_for

__all__ = ["MANIFEST", "optimizer_state_folder", "optimizer_state_root", "write_optimizer_state_rows", "write_manifest",
           "read_optimizer_state_rows", "prune_optimizer_state_folders", "remove_temporary_root"]

#: Each folder's list of what the ranks wrote, written last: ``{"iteration": n, "pieces": [[layer, kind, start, end,
#: file], ...]}``, ``file`` relative to the layer's folder.
MANIFEST = "manifest.json"
#: A piece of a table's optimizer state one rank wrote: ``[layer, kind, start, end, file]``.
Piece = List[Any]
_FOLDER_RE = re.compile(r"^slots-(?P<iteration>\d+)-[0-9a-f]+$")


def optimizer_state_root(model_dir: Optional[str], master: str) -> Tuple[str, bool]:
    """``(root, temporary)``: where a training run keeps its sharded tables' optimizer state.

    ``model_dir/tables`` when there is a ``model_dir`` (every executor must reach it); without one, a new
    temporary folder of the driver's disk, which only a local master's executors share (the caller deletes it).

    Raises
    ------
    ConfigurationError
        No ``model_dir`` and a master whose executors may not share the driver's disk.
    """
    if model_dir:
        return join(model_dir, "tables"), False
    if master.startswith("local"):
        return tempfile.mkdtemp(prefix="sparktf-slots-"), True
    raise ConfigurationError(
        f"sharded tables keep their optimizer state in files the workers write and read between segments, and the "
        f"master {master or '(unknown)'!r} may run them on other machines: pass TFOptimizer a model_dir that every "
        "executor can read and write (HDFS, S3, a shared file system), or keep the tables replicated")


def remove_temporary_root(root: str) -> None:
    """Delete a temporary root :func:`optimizer_state_root` made (its training is over)."""
    shutil.rmtree(root, ignore_errors=True)


def optimizer_state_folder(root: str, iteration: int, launch_secret: bytes) -> str:
    """The folder of the optimizer state the ranks of the launch of ``launch_secret`` write at ``iteration`` (a
    relaunch never writes into a failed launch's folder; the name does not tell the secret)."""
    return join(root, f"slots-{int(iteration)}-{hashlib.sha256(launch_secret).hexdigest()[:12]}")


def write_optimizer_state_rows(folder: str, layer: str, start: int, end: int,
                               state: Mapping[str, np.ndarray]) -> List[Piece]:
    """Write rows ``[start, end)`` of ``layer``'s optimizer state (by kind), each file complete or not at all; return
    the pieces written, for the folder's manifest (:func:`write_manifest`)."""
    if end <= start:
        return []
    store = store_for(folder, "the sharded tables' optimizer-state folder")
    directory = join(folder, layer)
    store.makedirs(directory)
    pieces = []
    for kind, rows in state.items():
        if len(rows) != end - start:
            raise ValueError(f"optimizer state {kind!r} of {layer!r}: {len(rows)} rows for [{start}, {end})")
        with store.atomic_file(join(directory, f"{kind}.{start}-{end}.npy")) as local, open(local, "wb") as handle:
            np.save(handle, np.ascontiguousarray(rows))
        pieces.append([layer, kind, int(start), int(end), f"{kind}.{start}-{end}.npy"])
    return pieces


def write_manifest(folder: str, iteration: int, pieces: Iterable[Sequence[Any]]) -> None:
    """Write the folder's manifest, once every rank has written its pieces: the iteration and each piece (layer,
    kind, first and end row, file). A folder without one was not finished; readers take its pieces from it."""
    store = store_for(folder, "the sharded tables' optimizer-state folder")
    manifest = {"iteration": int(iteration), "pieces": sorted([str(layer), str(kind), int(start), int(end), str(name)]
                                                             for layer, kind, start, end, name in pieces)}
    with store.atomic_file(join(folder, MANIFEST)) as local, open(local, "w") as handle:
        json.dump(manifest, handle)


def read_optimizer_state_rows(folder: str, layer: str, start: int, end: int,
                              kinds: Sequence[str]) -> Dict[str, np.ndarray]:
    """Rows ``[start, end)`` of ``layer``'s optimizer state of ``kinds``, from the files that hold them.

    Raises
    ------
    StorageError
        The folder has no manifest (not reachable from here, or not finished), its manifest lacks some of the
        rows, or a piece it lists cannot be read.
    """
    directory = join(folder, layer)
    found: Dict[str, List[Tuple[int, int, str]]] = {}
    for piece_layer, kind, piece_start, piece_end, name in (_manifest(folder)["pieces"] if end > start else ()):
        if piece_layer == layer:
            found.setdefault(kind, []).append((int(piece_start), int(piece_end), name))
    out = {}
    for kind in kinds:
        pieces = sorted(piece for piece in found.get(kind, ()) if piece[0] < end and piece[1] > start)
        covered = start
        for piece_start, piece_end, _ in pieces:
            if piece_start > covered:
                break
            covered = max(covered, piece_end)
        if covered < end:
            raise StorageError(
                f"the optimizer variable {kind!r} of sharded table {layer!r} lacks rows [{covered}, {end}) in the "
                f"manifest of {folder!r} (it lists rows {[(s, e) for s, e, _ in pieces]}): the ranks that wrote the "
                "folder did not hold the whole table; resume from a checkpoint of the same tables", path=folder)
        rows = None
        for piece_start, piece_end, name in pieces:
            with local_copy(join(directory, name), "optimizer-state file") as local:
                part = np.load(local, mmap_mode="r")
                if rows is None:
                    rows = np.empty((end - start, *part.shape[1:]), part.dtype)
                low, high = max(start, piece_start), min(end, piece_end)
                rows[low - start:high - start] = part[low - piece_start:high - piece_start]
        out[kind] = rows if rows is not None else np.zeros((0,), np.float32)
    return out


def _manifest(folder: str) -> Dict[str, Any]:
    """The folder's manifest (:func:`write_manifest`).

    Raises
    ------
    StorageError
        The folder has none: not reachable from here, or the segment that wrote it did not finish.
    """
    store = store_for(folder, "the sharded tables' optimizer-state folder")
    path = join(folder, MANIFEST)
    if not store.exists(path):
        raise StorageError(
            f"the sharded tables' optimizer-state folder {folder!r} has no {MANIFEST}: it is not reachable from here "
            "(the folder must be one every executor and the driver read and write: model_dir on HDFS, S3 or a shared "
            "file system), or the segment that wrote it did not finish, or its files were removed while training "
            "or resuming needed them", path=folder)
    with local_copy(path, "optimizer-state manifest") as local, open(local) as handle:
        return json.load(handle)


def prune_optimizer_state_folders(root: str, keep_iterations: Iterable[int], keep_folder: Optional[str]) -> None:
    """Delete ``root``'s optimizer-state folders but ``keep_folder`` and those of ``keep_iterations`` (the
    checkpoints')."""
    store = store_for(root, "the sharded tables' optimizer-state folder")
    if not store.exists(root):
        return
    keep = set(int(i) for i in keep_iterations)
    for name in store.listdir(root):
        match = _FOLDER_RE.match(name)
        path = join(root, name)
        if match and int(match["iteration"]) not in keep and path != keep_folder:
            store.delete(path, recursive=True)
