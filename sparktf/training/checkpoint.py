"""Training state (weights, optimizer variables, iteration) and its checkpoint files.

A :class:`ModelState` is what moves between the driver and the barrier tasks
at segment boundaries and what a checkpoint holds. Checkpoints are
``model_dir/checkpoint-<iteration>.npz`` files written by the driver, complete
or not at all, through :mod:`sparktf.storage` (a local folder or any URI the
driver can write), so ``model_dir`` only needs to be visible to the driver; with sharded tables a checkpoint
names the folder of their optimizer state instead of holding them, which the workers write
(``training.tables.optimizer_state_store``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from sparktf.errors import SparkTFError
from sparktf.models.layer_state import weights_assigned
from sparktf.storage import join, local_copy, scheme_of, store_for
from sparktf.storage.uri import split

__all__ = ["ModelState", "RowRanges", "checkpoint_iterations", "checkpoint_path", "latest_checkpoint",
           "find_checkpoint", "save_checkpoint",
           "write_checkpoint", "prune_checkpoints", "load_checkpoint"]

#: Rows ``(start, end)`` of some of a state's arrays, by index among ``weights + optimizer_variables``: a sharded
#: table's and its optimizer state's rows one rank holds.
RowRanges = Dict[int, Tuple[int, int]]

_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)\.npz$")
_TEMP_RE = re.compile(r"^checkpoint-\d+\.npz\.tmp-\d+$")


@dataclass
class ModelState:
    """Weights and optimizer variables of a Keras model at an absolute iteration.

    Attributes
    ----------
    weights : list of numpy.ndarray
        ``model.weights`` in order (trainable and non-trainable).
    optimizer_variables : list of numpy.ndarray
        ``model.optimizer.variables`` in order (empty when not captured).
    iteration : int
        Absolute number of iterations trained.
    optimizer_state_folder : str, optional
        The folder of the sharded tables' optimizer state at ``iteration``
        (``training.tables.optimizer_state_store``), which ``optimizer_variables``
        leaves out; None: they start fresh (or nothing is sharded).
    optimizer_state_tables : tuple of str
        The ``Embedding`` layers whose optimizer state is in ``optimizer_state_folder``, not here.
    stream : tuple, optional
        ``(query id, batch id)``: the last micro-batch of a stream the state
        has trained on (``optimize_stream``), committed with it.
    publish_due : int
        The stream's micro-batches trained since its last published version,
        that one included (``publish_every``'s cadence across restarts).
    """

    weights: List[np.ndarray]
    optimizer_variables: List[np.ndarray]
    iteration: int = 0
    optimizer_state_folder: Optional[str] = None
    optimizer_state_tables: Tuple[str, ...] = ()
    stream: Optional[Tuple[str, int]] = None
    publish_due: int = 0

    @classmethod
    def capture(cls, model, iteration: int = 0, include_optimizer: bool = True) -> "ModelState":
        """Copy the weights and (with ``include_optimizer``) the built optimizer's variables of ``model``."""
        optimizer = getattr(model, "optimizer", None) if include_optimizer else None
        # .numpy() first: np.array(variable) goes through Keras' __array__, which NumPy 2 warns takes no copy keyword
        optimizer_values = [] if optimizer is None else [np.array(v.numpy()) for v in optimizer.variables]
        return cls([np.array(v.numpy()) for v in model.weights], optimizer_values, int(iteration))

    def to_wire(self) -> Tuple[Dict[str, Any], List[np.ndarray]]:
        """``(meta, arrays)`` for the job channel: the arrays are the state's own, not copies."""
        meta = {"iteration": self.iteration, "weights": len(self.weights), "slots": self.optimizer_state_folder}
        return meta, self.weights + self.optimizer_variables

    @classmethod
    def from_wire(cls, meta: Dict[str, Any], arrays: List[np.ndarray]) -> "ModelState":
        """The state :meth:`to_wire` described."""
        count = int(meta["weights"])
        return cls(arrays[:count], arrays[count:], int(meta["iteration"]), meta.get("slots"))

    def array(self, index: int) -> np.ndarray:
        """The array at ``index`` of ``weights + optimizer_variables`` (the wire's order)."""
        count = len(self.weights)
        return self.weights[index] if index < count else self.optimizer_variables[index - count]

    def set_array(self, index: int, value: np.ndarray) -> None:
        """Replace the array at ``index`` of ``weights + optimizer_variables``."""
        count = len(self.weights)
        if index < count:
            self.weights[index] = value
        else:
            self.optimizer_variables[index - count] = value

    def rows(self, ranges: RowRanges) -> "ModelState":
        """This state with the arrays ``ranges`` names cut to their rows (views, not copies)."""
        cut = dataclasses.replace(self, weights=list(self.weights), optimizer_variables=list(self.optimizer_variables))
        for index, (start, end) in ranges.items():
            cut.set_array(index, self.array(index)[start:end])
        return cut

    @property
    def nbytes(self) -> int:
        """Bytes of all the arrays."""
        return sum(a.nbytes for a in self.weights) + sum(a.nbytes for a in self.optimizer_variables)

    def apply_to(self, model, keep: frozenset = frozenset()) -> Dict[int, np.ndarray]:
        """Assign the weights and optimizer variables to ``model`` (same architecture).

        The variables whose ``id`` is in ``keep`` are not assigned: their values are returned, by ``id``
        (a sharded table's, whose shape on a worker differs).
        """
        kept = _assign(model.weights, self.weights, "model weights", keep)
        weights_assigned(model)  # e.g. an adapted Normalization's constants
        if self.optimizer_variables:
            kept.update(_assign(model.optimizer.variables, self.optimizer_variables, "optimizer variables", keep))
        return kept


def _assign(variables, values, what: str, keep: frozenset) -> Dict[int, np.ndarray]:
    if len(variables) != len(values):
        raise SparkTFError(
            f"cannot restore {what}: the model has {len(variables)} but the state has "
            f"{len(values)}; restore a checkpoint of the same model and optimizer"
        )
    kept = {}
    for variable, value in zip(variables, values):
        if id(variable) in keep:
            kept[id(variable)] = value
        else:
            variable.assign(value)
    return kept


def checkpoint_path(model_dir: str, iteration: int) -> str:
    """Path of the checkpoint of ``iteration`` in ``model_dir``."""
    return join(model_dir, f"checkpoint-{iteration}.npz")


def _checkpoints(model_dir: str) -> List[Tuple[int, str]]:
    """``(iteration, name)`` of every complete checkpoint in ``model_dir``, oldest first."""
    names = store_for(model_dir, "model_dir").listdir(model_dir)
    return sorted((int(match.group(1)), name) for name in names if (match := _CHECKPOINT_RE.match(name)))


def checkpoint_iterations(model_dir: str) -> List[int]:
    """The iterations of the complete checkpoints in ``model_dir``, oldest first."""
    return [iteration for iteration, _ in _checkpoints(model_dir)]


def latest_checkpoint(model_dir: str) -> Optional[str]:
    """Path of the checkpoint with the highest iteration in ``model_dir``, or None."""
    found = _checkpoints(model_dir)
    return join(model_dir, found[-1][1]) if found else None


def find_checkpoint(path: Optional[str], model_dir: Optional[str], version: Optional[int] = None) -> str:
    """The checkpoint file ``path`` names: a file, or ``version`` (default: the latest) of a directory.

    ``path=None`` means ``model_dir``.
    """
    directory = model_dir if path is None else path
    if directory is None:
        raise SparkTFError("load_checkpoint needs a path, or a TFOptimizer with model_dir")
    if version is not None:
        return checkpoint_path(directory, int(version))
    if path is not None and path.endswith(".npz"):
        return path
    latest = latest_checkpoint(directory)
    if latest is None:
        raise SparkTFError(f"no checkpoint in {directory!r}; run optimize with model_dir first")
    return latest


def save_checkpoint(state: ModelState, model_dir: str, keep: Optional[int] = None) -> str:
    """Write ``state`` to ``model_dir/checkpoint-<iteration>.npz``, complete or not at all; return the path.

    Then, with ``keep``, delete all but the ``keep`` newest checkpoints, and
    what an earlier writer killed mid-write left behind.
    """
    path = write_checkpoint(state, model_dir)
    prune_checkpoints(model_dir, keep)
    return path


def write_checkpoint(state: ModelState, model_dir: str) -> str:
    """Write ``state`` to ``model_dir/checkpoint-<iteration>.npz``, complete or not at all; return the path."""
    store = store_for(model_dir, "model_dir")
    store.makedirs(model_dir)
    path = checkpoint_path(model_dir, state.iteration)
    arrays = {f"w{i}": w for i, w in enumerate(state.weights)}
    arrays.update({f"o{i}": o for i, o in enumerate(state.optimizer_variables)})
    folder = state.optimizer_state_folder
    with store.atomic_file(path) as local:
        with open(local, "wb") as handle:
            np.savez(
                handle,
                iteration=np.int64(state.iteration),
                counts=np.array([len(state.weights), len(state.optimizer_variables)]),
                slots=np.array(_relative(folder, model_dir) if folder else ""),
                slot_tables=np.array(list(state.optimizer_state_tables), dtype=str),  # the file format's names
                stream_query=np.array(state.stream[0] if state.stream else ""),
                stream_batch=np.int64(state.stream[1] if state.stream else -1),
                stream_publish_due=np.int64(state.publish_due),
                **arrays,
            )
    return path


def prune_checkpoints(model_dir: str, keep: Optional[int]) -> None:
    """Remove old checkpoints beyond ``keep`` and in-progress files of writers that died (one writer per folder)."""
    store = store_for(model_dir, "model_dir")
    names = store.listdir(model_dir)
    stale = [name for name in names if _TEMP_RE.match(name)]
    if keep is not None:
        stale += [name for _, name in _checkpoints(model_dir)[:-keep]]
    for name in stale:
        store.delete(join(model_dir, name))


def load_checkpoint(path: str) -> ModelState:
    """Read a checkpoint written by :func:`save_checkpoint`."""
    store = store_for(path, "checkpoint path")
    if not store.exists(path) or store.isdir(path):
        raise SparkTFError(f"checkpoint {path!r} does not exist; pass a path written by optimize")
    with local_copy(path, "checkpoint") as local, np.load(local) as data:
        num_weights, num_optimizer = (int(n) for n in data["counts"])
        folder = str(data["slots"]) if "slots" in data.files else ""
        return ModelState(
            [data[f"w{i}"] for i in range(num_weights)],
            [data[f"o{i}"] for i in range(num_optimizer)],
            int(data["iteration"]),
            (folder if scheme_of(folder) or os.path.isabs(folder) else join(split(path)[0], folder)) if folder
            else None,
            tuple(str(name) for name in data["slot_tables"]) if "slot_tables" in data.files else (),
            _stream_of(data),
            int(data["stream_publish_due"]) if "stream_publish_due" in data.files else 0,
        )


def _stream_of(data: Any) -> Optional[Tuple[str, int]]:
    """A checkpoint's ``(query id, batch id)``, or None (none recorded, or written before streams)."""
    if "stream_query" not in data.files or not str(data["stream_query"]):
        return None
    return str(data["stream_query"]), int(data["stream_batch"])


def _relative(folder: str, model_dir: str) -> str:
    """``folder`` relative to ``model_dir`` when inside it (a moved model_dir keeps its checkpoints whole)."""
    prefix = join(model_dir, "")
    return folder[len(prefix):] if folder.startswith(prefix) else folder
