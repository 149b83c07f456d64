"""``Communicator``: the collective operations sparktf's training workers use.

A communicator joins ``world_size`` ranks in a ring of authenticated TCP
connections (see ``rendezvous``) and runs ring algorithms over it (see
``ring``).  It is built inside Spark barrier tasks with
:meth:`Communicator.from_barrier_context`, or from an explicit peer list with
:meth:`Communicator.from_peers`.
"""

from __future__ import annotations

import json
import socket
import weakref
from typing import Any, Callable, Sequence, TypeVar

import ml_dtypes
import numpy as np

from sparktf.collective.auth import check_secret
from sparktf.collective.link import RingLink, WireSeconds
from sparktf.collective.channel_client import directory_peers
from sparktf.collective.rendezvous import (barrier_task_peers, bind_listener, checked_claim, connect_ring, format_peer,
                                          parse_peer)
from sparktf.collective.ring import (SEGMENT_BYTES, ring_allgather, ring_allgather_bytes, ring_allreduce,
                                     ring_alltoall, ring_broadcast)
from sparktf.errors import CollectiveError

__all__ = ["Communicator", "SUPPORTED_DTYPES", "WIRE_DTYPES"]

SUPPORTED_DTYPES = tuple(np.dtype(name) for name in ("float32", "float64", "int32", "int64"))
# what a compressed all-reduce sends floating-point values as
WIRE_DTYPES = {"bf16": np.dtype(ml_dtypes.bfloat16), "fp16": np.dtype(np.float16)}
MAX_OBJECT_BYTES = 16 << 20
_DIRECTORY_CONNECT_SECONDS = 30.0
# Barrier tasks start together, but one task's Python worker may take seconds
# longer to get going (fork, imports) on a loaded executor: registering with
# the peer directory waits at least this long, whatever the collective timeout.
_REGISTRATION_SECONDS = 30.0
_ALLREDUCE, _BROADCAST, _ALLGATHER, _BARRIER, _ALLREDUCE_BF16, _ALLREDUCE_FP16, _ALLGATHERV, _ALLTOALLV = range(1, 9)
_ALLREDUCE_BY_COMPRESSION = {None: _ALLREDUCE, "bf16": _ALLREDUCE_BF16, "fp16": _ALLREDUCE_FP16}
_T = TypeVar("_T")


class Communicator:
    """Collective operations among ``world_size`` ranks connected in a ring.

    Use :meth:`from_barrier_context` or :meth:`from_peers` to build one.  Every
    rank must call the same collectives in the same order with buffers of the
    same size and dtype.  A dead peer (closed connection) makes the call raise
    :class:`~sparktf.errors.CollectiveError` at once, a silent one after
    ``timeout`` seconds; the error names the peer's rank, and the communicator
    is closed afterwards.  Use it as a context manager or call :meth:`close`.

    Parameters
    ----------
    rank : int
        This rank, ``0 <= rank < world_size``.
    world_size : int
        Number of ranks.
    link : RingLink or None
        The connected ring (None when ``world_size`` is 1); it carries the timeout.
    claims : list of (int or None), optional
        What each rank published with its address (see
        :meth:`from_barrier_context`); None for every rank by default.

    Attributes
    ----------
    claims : list of (int or None)
        Every rank's claim, by rank.

    Notes
    -----
    A communicator is used by one thread at a time.
    """

    def __init__(self, rank: int, world_size: int, link: RingLink | None, claims: list[int | None] | None = None):
        self._rank = rank
        self._world_size = world_size
        self.claims = list(claims) if claims is not None else [None] * world_size
        self._link = link
        self._scratch = np.empty(SEGMENT_BYTES if link is not None else 0, dtype=np.uint8)
        self._wire = np.empty(0, dtype=np.uint8)  # a compressed all-reduce's outgoing values, grown as needed
        self._failure: BaseException | None = None
        self._closed = False
        # a communicator dropped without close() still ends its thread and sockets
        self._release = weakref.finalize(self, link.close) if link is not None else None

    @classmethod
    def from_peers(cls, rank: int, peers: list[str], secret: bytes, timeout: float = 300.0,
                   listener: socket.socket | None = None) -> "Communicator":
        """Connect ``rank`` to the ring of ``peers``.

        Parameters
        ----------
        rank : int
            This rank: its index in ``peers``.
        peers : list of str
            ``"host:port"`` of every rank's listening socket, by rank.
        secret : bytes
            The job secret (at least 16 bytes) every rank shares.
        timeout : float
            Seconds to wait for the neighbours to connect, and for a silent
            peer during a collective.
        listener : socket.socket, optional
            This rank's already listening socket (from :func:`bind_listener`);
            the communicator takes it over and closes it once connected.
            Without it, a socket is bound to ``peers[rank]``.

        Returns
        -------
        Communicator

        Raises
        ------
        CollectiveError
            A neighbour did not connect or authenticate within ``timeout``.
        """
        secret = _checked(secret, timeout)
        if not 0 <= rank < len(peers):
            raise ValueError(f"rank must be in [0, {len(peers)}), got {rank}")
        if len(peers) == 1:
            if listener is not None:
                listener.close()
            return cls(0, 1, None)
        if listener is None:
            listener = bind_listener(*parse_peer(peers[rank]))
        return cls._join_ring(rank, list(peers), listener, secret, timeout)

    @classmethod
    def from_barrier_context(cls, ctx, secret: bytes, timeout: float = 300.0,
                             directory: str | None = None, claim: int | None = None) -> "Communicator":
        """Connect the tasks of a Spark barrier stage; rank is the partition id.

        Each task listens on its executor's own address (the host Spark lists
        for it in ``ctx.getTaskInfos()``), publishes ``host:port`` (to the
        driver's :class:`~sparktf.collective.JobChannel` at
        ``directory``, else with ``ctx.allGather``, which costs ~1 s) and
        connects to its ring neighbours.

        Parameters
        ----------
        ctx : pyspark.BarrierTaskContext
            The running task's context (``BarrierTaskContext.get()``).
        secret : bytes
            The job secret, created on the driver (``secrets.token_bytes(32)``)
            and shipped in the task closure.
        timeout : float
            As in :meth:`from_peers`.
        directory : str, optional
            ``"host:port"`` of the job's peer directory on the driver.
        claim : int, optional
            Published with the address: an index below the number of tasks
            that the caller gives a meaning (training: the input shard this
            process holds ready). Every rank's is in :attr:`claims`.

        Returns
        -------
        Communicator
        """
        secret = _checked(secret, timeout)
        rank = ctx.partitionId()
        infos = ctx.getTaskInfos()
        if len(infos) == 1:
            return cls(0, 1, None, [checked_claim(claim, 1)])
        host, _ = parse_peer(infos[rank].address)
        listener = bind_listener(host)
        try:
            if directory is None:
                peers, claims = barrier_task_peers(ctx, listener, claim)
            else:
                peers, claims = directory_peers(directory, rank, len(infos), format_peer(listener), secret,
                                                min(timeout, _DIRECTORY_CONNECT_SECONDS),
                                                max(timeout, _REGISTRATION_SECONDS), claim)
        except BaseException:
            listener.close()
            raise
        return cls._join_ring(rank, peers, listener, secret, timeout, claims)

    @classmethod
    def _join_ring(cls, rank: int, peers: list[str], listener: socket.socket, secret: bytes,
                   timeout: float, claims: list[int | None] | None = None) -> "Communicator":
        """Connect to the ring neighbours through ``listener``, which is closed afterwards."""
        try:
            left, right = connect_ring(rank, peers, listener, secret, timeout)
        finally:
            listener.close()
        return cls(rank, len(peers), RingLink(rank, len(peers), left, right, timeout), claims)

    @property
    def rank(self) -> int:
        """This rank, ``0 <= rank < world_size``."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of ranks in the ring."""
        return self._world_size

    @property
    def wire_seconds(self) -> WireSeconds:
        """Seconds of this rank's ring traffic so far: its sends, receiving, and waiting for its left neighbour
        (see :attr:`RingLink.wire_seconds`; zeros for a ring of one)."""
        return WireSeconds(0.0, 0.0, 0.0) if self._link is None else self._link.wire_seconds

    def allreduce(self, buffer: np.ndarray, op: str = "mean", compression: str | None = None) -> np.ndarray:
        """Sum or average ``buffer`` over all ranks, in place.

        Parameters
        ----------
        buffer : numpy.ndarray
            A writeable, contiguous array of float32, float64, int32 or int64,
            of the same shape and dtype on every rank.
        op : {"mean", "sum"}
            Sums are computed in the buffer's dtype (integers wrap around on
            overflow, as in NumPy); "mean" divides the sum once by
            ``world_size``, rounding integers down (floor division).
        compression : {None, "bf16", "fp16"}
            Send a floating-point buffer's values as bfloat16 or float16 (half
            the bytes of float32).  Only the wire is narrower: sums are
            computed in the buffer's dtype, each value sent is rounded once
            and the result is the final sum rounded to the wire dtype (with
            one rank nothing travels and nothing is rounded).  float16 turns
            magnitudes above 65504 into inf, on every rank alike.  Integer
            buffers always travel exactly.  Every rank must pass the same
            value.  The communicator keeps a wire buffer of the largest
            compressed size it has sent (half a float32 buffer).

        Returns
        -------
        numpy.ndarray
            ``buffer`` itself; every rank holds the same bits.
        """
        if op not in ("mean", "sum"):
            raise ValueError(f"op must be 'mean' or 'sum', got {op!r}")
        if compression is not None and compression not in WIRE_DTYPES:
            raise ValueError(f"compression must be None, 'bf16' or 'fp16', got {compression!r}")
        flat = _flat_view(buffer, "allreduce")
        if flat.dtype.kind != "f":
            compression = None
        self._run(_tag(_ALLREDUCE_BY_COMPRESSION[compression], flat), lambda link: ring_allreduce(
            link, flat, self._world_size, op == "mean", self._scratch,
            None if compression is None else self._wire_buffer(flat.size, WIRE_DTYPES[compression])))
        return buffer

    def broadcast(self, buffer: np.ndarray, root: int = 0) -> np.ndarray:
        """Overwrite ``buffer`` on every rank with ``root``'s, in place.

        Parameters
        ----------
        buffer : numpy.ndarray
            As in :meth:`allreduce`.
        root : int
            The rank whose buffer is copied.

        Returns
        -------
        numpy.ndarray
            ``buffer`` itself.
        """
        if not 0 <= root < self._world_size:
            raise ValueError(f"root must be in [0, {self._world_size}), got {root}")
        flat = _flat_view(buffer, "broadcast")
        self._run(_tag(_BROADCAST, flat), lambda link: ring_broadcast(link, flat, self._world_size, root))
        return buffer

    def allgatherv(self, part: np.ndarray, counts: Sequence[int]) -> np.ndarray:
        """Concatenate every rank's ``part``, in rank order: an all-gather of parts of different lengths.

        Parameters
        ----------
        part : numpy.ndarray
            This rank's elements (any shape, read flat), of the same dtype on
            every rank.
        counts : sequence of int
            The number of elements of every rank's part, by rank, the same on
            every rank (e.g. all-reduced beforehand); ``counts[rank]`` is
            ``part.size``. A part may be empty.

        Returns
        -------
        numpy.ndarray
            A new 1-D array of ``sum(counts)`` elements: rank 0's part, then
            rank 1's, ... The same bits on every rank.
        """
        part = np.asarray(part)
        counts = [int(count) for count in counts]
        if len(counts) != self._world_size or min(counts) < 0:
            raise ValueError(f"allgatherv needs {self._world_size} counts >= 0 (one per rank), got {counts}")
        if counts[self._rank] != part.size:
            raise ValueError(f"allgatherv: rank {self._rank}'s part has {part.size} elements, "
                             f"but counts[{self._rank}] is {counts[self._rank]}")
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        gathered = np.empty(int(offsets[-1]), dtype=part.dtype)
        gathered[offsets[self._rank]:offsets[self._rank + 1]] = part.reshape(-1)
        byte_offsets = [int(offset) * part.dtype.itemsize for offset in offsets]
        self._run(_tag(_ALLGATHERV, gathered), lambda link: ring_allgather(
            link, gathered.view(np.uint8), byte_offsets, self._world_size))
        return gathered

    def alltoallv(self, parts: Sequence[np.ndarray], counts: Any) -> list[np.ndarray]:
        """Send ``parts[d]`` to rank ``d``; return what every rank sent this one: an all-to-all of parts of any length.

        Parameters
        ----------
        parts : sequence of numpy.ndarray
            ``world_size`` arrays of one dtype, the same on every rank (any
            shape, read flat): ``parts[d]`` goes to rank ``d``, ``parts[rank]``
            stays here. A part may be empty.
        counts : array-like of int, shape (world_size, world_size)
            ``counts[s][d]``: the elements rank ``s`` sends rank ``d``, the same
            on every rank (e.g. all-gathered beforehand); ``counts[rank][d]``
            is ``parts[d].size``.

        Returns
        -------
        list of numpy.ndarray
            ``world_size`` new 1-D arrays, by source rank: ``received[s]``
            holds the ``counts[s][rank]`` elements rank ``s`` sent this one.
        """
        parts = [np.asarray(part) for part in parts]
        counts = np.asarray(counts, dtype=np.int64)
        size = self._world_size
        if len(parts) != size or counts.shape != (size, size) or (counts < 0).any():
            raise ValueError(f"alltoallv needs {size} parts and a {size} x {size} matrix of counts >= 0, got "
                             f"{len(parts)} parts and counts of shape {counts.shape}")
        dtype = parts[0].dtype
        if dtype not in SUPPORTED_DTYPES or any(part.dtype != dtype for part in parts):
            raise TypeError(f"alltoallv: parts must share one of {[d.name for d in SUPPORTED_DTYPES]}, got "
                            f"{sorted({part.dtype.name for part in parts})}")
        sizes = [part.size for part in parts]
        if sizes != counts[self._rank].tolist():
            raise ValueError(f"alltoallv: rank {self._rank}'s parts have {sizes} elements, but its row of counts is "
                             f"{counts[self._rank].tolist()}")
        received = [np.empty(int(counts[source, self._rank]), dtype) for source in range(size)]
        received[self._rank][:] = parts[self._rank].reshape(-1)
        sends = [np.ascontiguousarray(part).reshape(-1).view(np.uint8) for part in parts]
        receives = [part.view(np.uint8) for part in received]
        self._run(_tag(_ALLTOALLV, received[self._rank]), lambda link: ring_alltoall(
            link, sends, receives, counts * dtype.itemsize, size))
        return received

    def allgather_object(self, obj: Any) -> list:
        """Return every rank's ``obj``, indexed by rank.

        Parameters
        ----------
        obj : JSON-serialisable object
            Travels as JSON over the authenticated ring (never pickle), at most
            16 MiB encoded; tuples come back as lists.

        Returns
        -------
        list
            ``[obj of rank 0, obj of rank 1, ...]`` on every rank.
        """
        payload = json.dumps(obj).encode()
        if len(payload) > MAX_OBJECT_BYTES:
            raise ValueError(f"allgather_object takes at most {MAX_OBJECT_BYTES} bytes of JSON, got {len(payload)}")
        gathered = self._run(_ALLGATHER << 8, lambda link: ring_allgather_bytes(
            link, payload, self._world_size, MAX_OBJECT_BYTES))
        return [json.loads(item) for item in (gathered or [payload])]

    def barrier(self) -> None:
        """Return once every rank has called ``barrier``."""
        self._run(_BARRIER << 8, lambda link: ring_allgather_bytes(link, b"", self._world_size, 0))

    def close(self) -> None:
        """Close the connections and end the sender thread; safe to call twice."""
        self._closed = True
        if self._release is not None:
            self._release()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Communicator(rank={self._rank}, world_size={self._world_size})"

    def _wire_buffer(self, size: int, dtype: np.dtype) -> np.ndarray:
        """``size`` elements of ``dtype`` for the values a compressed all-reduce sends, reused across calls."""
        nbytes = size * dtype.itemsize
        if self._wire.nbytes < nbytes:
            self._wire = np.empty(nbytes, dtype=np.uint8)
        return self._wire[:nbytes].view(dtype)

    def _run(self, tag: int, collective: Callable[[RingLink], _T]) -> _T | None:
        if self._failure is not None:
            raise CollectiveError(f"this communicator failed earlier and is closed: {self._failure}")
        if self._closed:
            raise CollectiveError("this communicator is closed; build a new one to run more collectives")
        if self._link is None:
            return None
        self._link.begin(tag)
        try:
            return collective(self._link)
        except BaseException as exc:
            self._failure = exc
            self._closed = True
            self._release.detach()
            self._link.abort(exc)
            raise


def _checked(secret: bytes, timeout: float) -> bytes:
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return check_secret(secret)


def _flat_view(buffer: np.ndarray, what: str) -> np.ndarray:
    if not isinstance(buffer, np.ndarray):
        raise TypeError(f"{what} needs a numpy.ndarray, got {type(buffer).__name__}")
    if buffer.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{what} supports float32, float64, int32 and int64 buffers, got {buffer.dtype}")
    if not (buffer.flags.c_contiguous or buffer.flags.f_contiguous) or not buffer.flags.writeable:
        raise ValueError(f"{what} works in place on a writeable contiguous array; pass np.ascontiguousarray(x)")
    return buffer.reshape(-1, order="A")


def _tag(collective: int, flat: np.ndarray) -> int:
    return collective << 8 | ord(flat.dtype.char)

