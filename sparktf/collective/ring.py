"""Ring algorithms over a ``RingLink``: all-reduce, broadcast and all-gather.

All-reduce is the bandwidth-optimal ring: a reduce-scatter then an
all-gather over ``world_size`` chunks, each rank sending and receiving
``2 (n - 1) / n`` of the buffer.  Chunks are cut into segments of
``SEGMENT_BYTES`` that travel as separate frames, so a rank forwards segment
``k`` (on the sender thread) while it still receives and reduces segment
``k + 1``: both directions of every link and the reduction run at once.
Both ends of a link derive the same chunk and segment boundaries from the
buffer length alone.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from sparktf.collective.link import RingLink

__all__ = ["SEGMENT_BYTES", "ring_allreduce", "ring_allgather_bytes", "ring_broadcast"]

SEGMENT_BYTES = 1 << 20


def _bytes(array: np.ndarray) -> memoryview:
    return memoryview(array).cast("B")


def _segments(flat: np.ndarray, chunk: int, world_size: int) -> Iterator[np.ndarray]:
    """Views of segments of chunk ``chunk`` of ``flat`` (chunks split the buffer as evenly as possible)."""
    start = chunk * flat.size // world_size
    stop = (chunk + 1) * flat.size // world_size
    step = max(1, SEGMENT_BYTES // flat.itemsize)
    for offset in range(start, stop, step):
        yield flat[offset:min(offset + step, stop)]


def ring_allreduce(link: RingLink, flat: np.ndarray, world_size: int, mean: bool, scratch: np.ndarray) -> None:
    """Sum (or average) the 1-D contiguous ``flat`` over the ring, in place.

    ``scratch`` is a byte buffer of at least ``SEGMENT_BYTES``.  The owner of
    each chunk divides it once, right after its last addition, so every rank
    ends with the same bits; integer means round down (floor division).
    """
    rank = link.rank
    for segment in _segments(flat, rank, world_size):
        link.post(_bytes(segment))
    for step in range(world_size - 1):  # reduce-scatter
        last = step == world_size - 2
        for segment in _segments(flat, (rank - step - 1) % world_size, world_size):
            incoming = scratch[:segment.nbytes].view(flat.dtype)
            link.receive_into(_bytes(incoming))
            np.add(segment, incoming, out=segment)
            if last and mean:
                _divide(segment, world_size)
            link.post(_bytes(segment))
    for step in range(world_size - 1):  # all-gather
        for segment in _segments(flat, (rank - step) % world_size, world_size):
            link.receive_into(_bytes(segment))
            if step < world_size - 2:
                link.post(_bytes(segment))
    link.flush()


def _divide(segment: np.ndarray, world_size: int) -> None:
    if np.issubdtype(segment.dtype, np.integer):
        np.floor_divide(segment, world_size, out=segment)
    else:
        np.divide(segment, world_size, out=segment)


def ring_broadcast(link: RingLink, flat: np.ndarray, world_size: int, root: int) -> None:
    """Copy ``root``'s ``flat`` into every rank's, pipelined segment by segment along the ring."""
    forwards = link.right_rank != root
    for segment in _segments(flat, 0, 1):
        if link.rank != root:
            link.receive_into(_bytes(segment))
        if forwards:
            link.post(_bytes(segment))
    link.flush()


def ring_allgather_bytes(link: RingLink, payload: bytes, world_size: int, limit: int) -> list[bytes]:
    """Return every rank's ``payload`` (each at most ``limit`` bytes), indexed by rank."""
    gathered = [b""] * world_size
    gathered[link.rank] = payload
    link.post(memoryview(payload))
    for step in range(world_size - 1):
        received = link.receive_bytes(limit)
        gathered[(link.rank - step - 1) % world_size] = received
        if step < world_size - 2:
            link.post(memoryview(received))
    link.flush()
    return gathered
