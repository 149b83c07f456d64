"""Ring algorithms over a ``RingLink``: all-reduce, broadcast and all-gather.

All-reduce is the bandwidth-optimal ring: a reduce-scatter then an
all-gather over ``world_size`` chunks, each rank sending and receiving
``2 (n - 1) / n`` of the buffer.  Chunks are cut into segments of
``SEGMENT_BYTES`` that travel as separate frames, so a rank forwards segment
``k`` (on the sender thread) while it still receives and reduces segment
``k + 1``: both directions of every link and the reduction run at once.
Both ends of a link derive the same chunk and segment boundaries from the
buffer length (and the wire dtype) alone.

A compressed all-reduce sends float values over the wire in a narrower dtype
(bfloat16 or float16): each rank rounds its float partial sums to it, the
receiver widens them back and adds in the buffer's dtype, and the owner of a
chunk rounds its final sum once and keeps that rounded value itself, so every
rank ends with the same bits.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from sparktf.collective.link import RingLink

__all__ = ["SEGMENT_BYTES", "ring_allgather", "ring_allreduce", "ring_allgather_bytes", "ring_broadcast"]

SEGMENT_BYTES = 1 << 20


def _bytes(array: np.ndarray) -> memoryview:
    return memoryview(array.view(np.uint8))  # through uint8: the buffer protocol has no bfloat16


def _segments(flat: np.ndarray, wire: np.ndarray, chunk: int,
              world_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Views ``(segment of flat, same segment of wire)`` of chunk ``chunk``; ``wire`` may be ``flat`` itself.

    Chunks split the buffer as evenly as possible; a segment is at most
    ``SEGMENT_BYTES`` of ``wire``, the bytes that travel.
    """
    start = chunk * flat.size // world_size
    stop = (chunk + 1) * flat.size // world_size
    step = max(1, SEGMENT_BYTES // wire.itemsize)
    for offset in range(start, stop, step):
        part = slice(offset, min(offset + step, stop))
        yield flat[part], wire[part]


def ring_allreduce(link: RingLink, flat: np.ndarray, world_size: int, mean: bool, scratch: np.ndarray,
                   wire: np.ndarray | None = None) -> None:
    """Sum (or average) the 1-D contiguous ``flat`` over the ring, in place.

    ``scratch`` is a byte buffer of at least ``SEGMENT_BYTES``.  The owner of
    each chunk divides it once, right after its last addition, so every rank
    ends with the same bits; integer means round down (floor division).

    ``wire``, when given, is an array of ``flat``'s length in a narrower float
    dtype that the values travel in (compression; it must stay untouched by
    others until the call returns).  Sums stay in ``flat``'s dtype; each value
    sent is rounded to ``wire``'s dtype, and the owner of a chunk writes its
    rounded final sum back into ``flat``, the value every other rank receives.
    """
    narrow = wire is not None
    wire = flat if wire is None else wire
    rank = link.rank
    for segment, sent in _segments(flat, wire, rank, world_size):
        if narrow:
            np.copyto(sent, segment, casting="unsafe")
        link.post(_bytes(sent))
    for step in range(world_size - 1):  # reduce-scatter
        last = step == world_size - 2
        for segment, sent in _segments(flat, wire, (rank - step - 1) % world_size, world_size):
            incoming = scratch[:sent.nbytes].view(wire.dtype)
            link.receive_into(_bytes(incoming))
            if last:  # this chunk went through every rank: all have arrived, a slow send is the sender's own
                link.time_sends()
            np.add(segment, incoming, out=segment)  # widened: sums keep flat's precision
            if last and mean:
                _divide(segment, world_size)
            if narrow:
                np.copyto(sent, segment, casting="unsafe")
                if last:  # the owner keeps the rounded sum that every other rank receives
                    np.copyto(segment, sent)
            link.post(_bytes(sent))
    for step in range(world_size - 1):  # all-gather
        for segment, sent in _segments(flat, wire, (rank - step) % world_size, world_size):
            link.receive_into(_bytes(sent))
            if narrow:
                np.copyto(segment, sent)
            if step < world_size - 2:
                link.post(_bytes(sent))
    link.flush()


def _divide(segment: np.ndarray, world_size: int) -> None:
    """Divide ``segment`` by ``world_size`` in place (floor division for integers).

    A float segment is multiplied by ``1 / world_size`` when that is a power
    of two: the product is then exactly the quotient, and a multiplication
    costs about half a division.
    """
    if np.issubdtype(segment.dtype, np.integer):
        np.floor_divide(segment, world_size, out=segment)
    elif world_size & (world_size - 1) == 0:
        np.multiply(segment, segment.dtype.type(1 / world_size), out=segment)
    else:
        np.divide(segment, world_size, out=segment)


def ring_broadcast(link: RingLink, flat: np.ndarray, world_size: int, root: int) -> None:
    """Copy ``root``'s ``flat`` into every rank's, pipelined segment by segment along the ring."""
    forwards = link.right_rank != root
    for segment, _ in _segments(flat, flat, 0, 1):
        if link.rank != root:
            link.receive_into(_bytes(segment))
        if forwards:
            link.post(_bytes(segment))
    link.flush()


def ring_allgather(link: RingLink, out: np.ndarray, offsets: list[int], world_size: int) -> None:
    """Fill every rank's part of the byte array ``out`` with that rank's bytes, along the ring.

    Rank ``r``'s part is ``out[offsets[r]:offsets[r + 1]]`` (parts may be
    empty) and this rank's own part is filled on entry. Every rank passes the
    same ``offsets``. A part travels in frames of at most ``SEGMENT_BYTES``,
    each forwarded to the right as soon as it arrives, so large parts are
    pipelined around the ring.
    """

    def frames(owner: int) -> Iterator[np.ndarray]:
        for start in range(offsets[owner], offsets[owner + 1], SEGMENT_BYTES):
            yield out[start:min(start + SEGMENT_BYTES, offsets[owner + 1])]

    for frame in frames(link.rank):
        link.post(_bytes(frame))
    for step in range(world_size - 1):
        for frame in frames((link.rank - step - 1) % world_size):
            link.receive_into(_bytes(frame))
            if step < world_size - 2:
                link.post(_bytes(frame))
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


def ring_alltoall(link: RingLink, sends: list[np.ndarray], receives: list[np.ndarray], part_bytes: np.ndarray,
                  world_size: int) -> None:
    """Deliver ``sends[d]`` (this rank's bytes for rank ``d``) into rank ``d``'s ``receives[this rank]``, along the ring.

    ``part_bytes[s, d]``, the same on every rank, is the size of the part from
    rank ``s`` to rank ``d``: of ``s``'s ``sends[d]`` and of ``d``'s
    ``receives[s]`` (byte arrays). ``sends[rank]`` is not sent. A part from ``s`` travels
    ``(d - s) mod world_size`` hops to the right: each rank posts its own
    parts nearest first, then, for each farther source in turn, keeps the part
    addressed to it and forwards the rest in the order they came, so every
    link carries its frames in the order the receiver expects them. Parts
    travel in frames of at most ``SEGMENT_BYTES``.
    """

    def frames(part: np.ndarray) -> Iterator[np.ndarray]:
        for start in range(0, part.size, SEGMENT_BYTES):
            yield part[start:start + SEGMENT_BYTES]

    rank = link.rank
    for distance in range(1, world_size):
        for frame in frames(sends[(rank + distance) % world_size]):
            link.post(_bytes(frame))
    for hops in range(1, world_size):  # the parts of the source ``hops`` to the left, nearest destination first
        source = (rank - hops) % world_size
        for distance in range(hops, world_size):
            destination = (source + distance) % world_size
            if destination == rank:
                for frame in frames(receives[source]):
                    link.receive_into(_bytes(frame))
            else:  # a part passing through: its frames are posted as they arrive, each in a buffer of its own
                for frame in frames(np.empty(int(part_bytes[source, destination]), np.uint8)):
                    link.receive_into(_bytes(frame))
                    link.post(_bytes(frame))
    link.flush()
