"""Model state between the driver and the tasks: streamed over the job's channel, or through a broadcast.

The driver serves a :class:`~sparktf.training.checkpoint.ModelState` on a
:class:`~sparktf.collective.JobChannel` (see
:func:`sparktf.training.driver.served_job.job_channel`); a task fetches it with
:meth:`StateSource.fetch` and hands its final state back with
:meth:`StateSource.hand_back`, which the driver takes with
:func:`joined_uploads`. A rank holding a share of the sharded tables fetches
and hands back only its rows of them and their optimizer state, so no worker holds a
whole sharded table. Without a channel (``spark.sparktf.rendezvous=barrier``)
the state rides in a Spark broadcast and rank 0's task result instead.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from sparktf.collective.channel_client import ChannelClient, start_heartbeat
from sparktf.errors import TrainingError
from sparktf.training.checkpoint import ModelState, RowRanges

__all__ = ["StateSource", "joined_uploads", "rank_upload", "state_checksums"]

#: One rank's upload: ``(meta, arrays)``.
Upload = Tuple[Dict[str, Any], List[np.ndarray]]


@dataclass(frozen=True)
class StateSource:
    """Where a task gets the state and sends it back: the channel at ``address``, else ``broadcast``.

    Attributes
    ----------
    address : str, optional
        ``"host:port"`` of the job channel.
    secret : bytes
        The job secret.
    world_size : int
        Ranks (tasks) the channel serves.
    timeout : float
        Seconds to wait for the channel's bytes.
    broadcast : pyspark.Broadcast, optional
        The state, when there is no channel.
    """

    address: Optional[str]
    secret: bytes
    world_size: int
    timeout: float
    broadcast: Any = None

    def heartbeat(self, rank: int) -> Any:
        """A heartbeat of the task of ``rank`` to the channel (a stand-in without one)."""
        return start_heartbeat(self.address, rank, self.world_size, self.secret, self.timeout)

    def fetch(self, rank: int, rows: Optional[RowRanges] = None) -> ModelState:
        """The state, for the task of ``rank``; of the arrays ``rows`` names, only those rows (the rank's of a
        sharded table and its optimizer state)."""
        rows = rows or {}
        if self.address is None:
            return self.broadcast.value.rows(rows)
        request = {"op": "get_state", "rows": _wire_rows(rows)}
        with ChannelClient(self.address, rank, self.world_size, self.secret, self.timeout) as client:
            meta, arrays = client.request(request, self.timeout, what="fetching the model state")
        return ModelState.from_wire(meta, arrays)

    @contextlib.contextmanager
    def rows_by_id(self, rank: int) -> Iterator[Callable[[int, np.ndarray], np.ndarray]]:
        """``rows(index, ids)``: the rows at ``ids`` of the served state's array ``index`` (a sharded table's), over
        one connection of the task of ``rank`` to the job channel while the block runs."""
        with ChannelClient(self.address, rank, self.world_size, self.secret, self.timeout) as client:
            def rows(index: int, ids: np.ndarray) -> np.ndarray:
                _, arrays = client.request({"op": "get_rows", "index": int(index)}, self.timeout,
                                           [np.ascontiguousarray(ids, np.int64)], what="fetching a table's rows")
                return arrays[0]

            yield rows

    def hand_back(self, rank: int, state: ModelState, rows: RowRanges) -> Optional[ModelState]:
        """Send the rank's final ``state`` to the channel (None returned), or return it for the task's result
        without one. Of the arrays ``rows`` names, ``state`` holds the rank's rows, and a rank other than 0 sends
        only those."""
        if self.address is None:
            return state
        meta, arrays = rank_upload(rank, state, rows)
        with ChannelClient(self.address, rank, self.world_size, self.secret, self.timeout) as client:
            client.request({"op": "put_state", "meta": meta}, self.timeout, arrays, what="uploading the final state")
        return None


def rank_upload(rank: int, state: ModelState, rows: RowRanges) -> Upload:
    """What rank ``rank`` uploads of its final ``state``: rank 0 all of it, another rank the arrays ``rows`` names
    (its rows of the sharded tables and optimizer state); with their rows and checksums in the meta."""
    meta, arrays = state.to_wire()
    if rows:
        meta["rows"] = _wire_rows(rows)
        arrays = arrays if rank == 0 else [arrays[index] for index in sorted(rows)]
    meta["checksums"] = state_checksums(arrays)
    return meta, arrays


def joined_uploads(uploaded: Dict[int, Upload], what: str) -> ModelState:
    """Rank 0's final state with every rank's rows of the sharded tables joined into it (``uploaded``: the
    channel's uploads by rank), each upload checked against the checksums its rank computed.

    Raises
    ------
    TrainingError
        Rank 0 sent nothing, an upload arrived corrupted, or the ranks' rows do not join into whole arrays.
    """
    if 0 not in uploaded:
        raise TrainingError(f"{what} ended but rank 0 sent no model state to the driver")
    for rank, (meta, arrays) in sorted(uploaded.items()):
        if meta.get("checksums") != state_checksums(arrays):
            raise TrainingError(f"the model state rank {rank} sent after {what} arrived corrupted (checksums differ)")
    state = ModelState.from_wire(*uploaded[0])
    pieces: Dict[int, List[Tuple[int, int, np.ndarray]]] = {}  # state index -> each rank's (start, end, rows)
    for rank, (meta, arrays) in uploaded.items():
        rows = meta.get("rows", ())
        parts = [arrays[index] for index, _, _ in rows] if rank == 0 else arrays
        for (index, start, end), part in zip(rows, parts):
            pieces.setdefault(int(index), []).append((int(start), int(end), part))
    for index, parts in pieces.items():
        parts.sort(key=lambda part: part[0])
        if [start for start, _, _ in parts] != [0] + [end for _, end, _ in parts[:-1]]:
            raise TrainingError(f"after {what}, the ranks' rows of sharded state array {index} do not join up: "
                                f"{[(start, end) for start, end, _ in parts]}")
        state.set_array(index, np.concatenate([part for _, _, part in parts]))
    return state


def _wire_rows(rows: RowRanges) -> List[List[int]]:
    """``rows`` as the job channel takes them: ``[index, start, end]`` by index."""
    return [[index, *rows[index]] for index in sorted(rows)]


def state_checksums(arrays: List[np.ndarray]) -> List[float]:
    """One float64 sum per array: the driver checks the state it received against the rank's."""
    return [float(np.sum(a, dtype=np.float64)) for a in arrays]
