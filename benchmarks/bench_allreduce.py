"""All-reduce benchmark: 2 ranks on loopback vs a plain socket pair moving the same bytes.

For each size, rank 0 reports (nccl-tests definitions, n = 2 ranks):

* ``time``   mean seconds per ``Communicator.allreduce(op="mean")`` of float32;
* ``bf16 x``, ``fp16 x``  float32 ``time`` / the time of the same call with
  ``compression="bf16"`` / ``"fp16"`` (half the bytes on the wire, plus the
  conversions): above 1 the compressed all-reduce is faster;
* ``algbw``  bytes / time;
* ``busbw``  algbw * 2 (n - 1) / n, the bytes each rank sends and receives per second;
* ``raw_uni``  one socket pair, one process ``sendall``s the bytes, the other
  ``recv_into``s them (one direction busy);
* ``raw_bidi`` the same pair with both processes sending and receiving the
  bytes at once (a sender thread each), which is the traffic a 2-rank ring
  all-reduce has: each rank sends and receives ``bytes`` per call.

``busbw_ratio`` is ``busbw / raw_bidi``: how close the all-reduce gets to the
physical bound of this machine for its traffic pattern; ``raw_uni`` is shown
for reference.  The last two lines are ``RESULT bf16_speedup_64MiB=<float32
time / bf16 time>`` and ``RESULT busbw_ratio_64MiB=<ratio>``.

Two more columns explain the gap to ``raw_bidi`` (they change no result):

* ``into``  ``raw_bidi`` receiving into a second buffer of ``bytes`` instead of
  the reused sink, as the all-gather must write into the buffer itself;
* ``local%`` the all-reduce's own work without any I/O (the same
  ``ring_allreduce`` over a link that moves nothing: additions, the mean's
  scaling, the per-segment Python), as a share of ``time``.

``--wire-mbit RATE`` (root only) runs the two ranks in two network namespaces
joined by a veth pair capped at ``RATE`` Mbit/s each way (``wire_cap.py``), so
the wire rather than the CPU is the limit; it measures 1 MiB and up and ends
with ``RESULT wire_bf16_speedup_64MiB=`` and ``RESULT wire_busbw_ratio_64MiB=``
instead.  Without root it says so and exits.

Run ``python benchmarks/bench_allreduce.py [--quick] [--wire-mbit RATE]``
(``--quick`` stops at 64 MiB with fewer repetitions and takes well under a
minute on loopback).
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import secrets
import socket
import statistics
import threading
import time

import numpy as np

from sparktf.collective import WIRE_DTYPES, Communicator, bind_listener, format_peer
from sparktf.collective.rendezvous import parse_peer
from sparktf.collective.ring import SEGMENT_BYTES, ring_allreduce
from sparktf.collective.transport import configure_socket
from wire_cap import HOSTS, capped_wire, enter_namespace, unavailable

KIB, MIB = 1 << 10, 1 << 20
WORLD_SIZE = 2
ROUNDS = 5


def _sizes(quick: bool, wire: bool) -> list[int]:
    top = 64 * MIB if quick else 256 * MIB
    sizes, size = [], MIB if wire else 4 * KIB
    while size <= top:
        sizes.append(size)
        size *= 4
    return sizes


def _repetitions(size: int, quick: bool) -> int:
    budget = (64 if quick else 256) * MIB
    return int(min(200 if quick else 500, max(3, budget // size)))


def _raw_socket(rank: int, peers: list[str], listener: socket.socket) -> socket.socket:
    """A plain authenticated-by-nothing TCP connection between the two benchmark ranks."""
    if rank == 0:
        listener.settimeout(60)
        sock, _ = listener.accept()
    else:
        sock = socket.create_connection(parse_peer(peers[0]), timeout=60)
    listener.close()
    configure_socket(sock, 60)
    return sock


class RawPair:
    """The plain-socket reference: ``sendall`` from the buffer, ``recv_into`` a reused sink.

    Data goes out in ``sendall`` calls of ``PIECE_BYTES`` (one ``sendall`` of a
    whole 64 MiB buffer is slower here) into a reused sink of the same size,
    so the receiving side works in cache: this is the best a plain socket
    pair moves bytes on this machine, an upper bound for the all-reduce.
    ``exchange`` sends from a long-lived thread while the calling thread
    receives, like the communicator's sender thread.
    """

    PIECE_BYTES = 1 * MIB

    def __init__(self, rank: int, sock: socket.socket, max_bytes: int):
        self._rank = rank
        self._sock = sock
        self._sink = memoryview(bytearray(min(max_bytes, self.PIECE_BYTES)))
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._send_jobs, daemon=True)
        self._thread.start()

    def one_way(self, data: memoryview) -> None:
        """Rank 0 sends ``data`` to rank 1, which acknowledges with one byte."""
        if self._rank == 0:
            self._send(data)
            self._receive(1)
        else:
            self._receive(data.nbytes)
            self._sock.sendall(b"k")

    def exchange(self, data: memoryview, into: memoryview | None = None) -> None:
        """Both ranks send ``data`` and receive as many bytes at once, into the sink or into ``into``."""
        self._jobs.put(data)
        if into is None:
            self._receive(data.nbytes)
        else:
            for offset in range(0, into.nbytes, self.PIECE_BYTES):
                self._receive_into(into[offset:offset + self.PIECE_BYTES])
        self._done.get()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()
        self._sock.close()

    def _receive(self, size: int) -> None:
        while size:
            size -= self._sock.recv_into(self._sink[:min(size, self._sink.nbytes)])

    def _receive_into(self, view: memoryview) -> None:
        while view.nbytes:
            view = view[self._sock.recv_into(view):]

    def _send_jobs(self) -> None:
        while (data := self._jobs.get()) is not None:
            self._send(data)
            self._done.put(True)

    def _send(self, data: memoryview) -> None:
        for offset in range(0, data.nbytes, self.PIECE_BYTES):
            self._sock.sendall(data[offset:offset + self.PIECE_BYTES])


class NoWire:
    """A stand-in for ``RingLink`` that moves nothing: ``ring_allreduce`` over it times the ring's local work.

    Every frame "received" leaves the destination as it is; the scratch a
    caller passes should hold float32 ones, so that repeated means converge
    to 1 instead of sinking into slow subnormals.
    """

    rank = 0

    def post(self, payload: memoryview) -> None:
        """Send nothing."""

    def receive_into(self, payload: memoryview) -> None:
        """Receive nothing."""

    def flush(self) -> None:
        """Wait for nothing."""


def _timed(function, repetitions: int, comm: Communicator) -> float:
    """Mean seconds per call of ``function`` over ``repetitions`` calls, both ranks starting together."""
    function()  # warm-up
    comm.barrier()
    start = time.perf_counter()
    for _ in range(repetitions):
        function()
    elapsed = time.perf_counter() - start
    comm.barrier()
    return elapsed / repetitions


def _rank_main(rank: int, secret: bytes, quick: bool, namespace: str | None, addresses, peers_in,
               results) -> None:
    if namespace is not None:
        enter_namespace(namespace)
    host = "127.0.0.1" if namespace is None else HOSTS[rank]
    listener, raw_listener = bind_listener(host), bind_listener(host)
    addresses.put((rank, format_peer(listener), format_peer(raw_listener)))
    peers, raw_peers = peers_in.get()
    sizes = _sizes(quick, namespace is not None)
    raw = RawPair(rank, _raw_socket(rank, raw_peers, raw_listener), max(sizes))
    scratch = np.ones(SEGMENT_BYTES // 4, dtype=np.float32).view(np.uint8)
    with Communicator.from_peers(rank, peers, secret, timeout=120, listener=listener) as comm:
        for size in sizes:
            buffer, into = np.ones(size // 4, dtype=np.float32), np.empty(size, dtype=np.uint8)
            data = memoryview(buffer).cast("B")
            repetitions = _repetitions(size, quick)
            operations = {
                "time": lambda: comm.allreduce(buffer, op="mean"),
                **{name: lambda name=name: comm.allreduce(buffer, op="mean", compression=name)
                   for name in WIRE_DTYPES},
                "raw_uni": lambda: raw.one_way(data),
                "raw_bidi": lambda: raw.exchange(data),
                "into": lambda: raw.exchange(data, memoryview(into)),
                "local": lambda: ring_allreduce(NoWire(), buffer, WORLD_SIZE, True, scratch),
            }
            timings = {name: [] for name in operations}
            for _ in range(ROUNDS):  # interleaved rounds, median of each: other jobs share the 2 cores
                for name, operation in operations.items():
                    timings[name].append(_timed(operation, repetitions, comm))
            row = {name: statistics.median(seconds) for name, seconds in timings.items()}
            row.update(size=size, **{name: size / row[name] for name in ("raw_uni", "raw_bidi", "into")})
            if rank == 0:
                results.put(row)
    raw.close()
    if rank == 0:
        results.put(None)


def _print_table(rows: list[dict]) -> None:
    print(f"{'size':>10} {'time(us)':>10} {'algbw GB/s':>11} {'busbw GB/s':>11} "
          f"{'raw_uni GB/s':>13} {'raw_bidi GB/s':>14} {'busbw/bidi':>11} {'busbw/uni':>10} "
          + " ".join(f"{name + ' x':>7}" for name in WIRE_DTYPES) + f" {'into GB/s':>10} {'local%':>7}")
    for row in rows:
        algbw = row["size"] / row["time"]
        busbw = algbw * 2 * (WORLD_SIZE - 1) / WORLD_SIZE
        row["ratio"] = busbw / row["raw_bidi"]
        size = f"{row['size'] // MIB} MiB" if row["size"] >= MIB else f"{row['size'] // KIB} KiB"
        speedups = " ".join(f"{row['time'] / row[name]:>7.2f}" for name in WIRE_DTYPES)
        print(f"{size:>10} {row['time'] * 1e6:>10.1f} {algbw / 1e9:>11.3f} {busbw / 1e9:>11.3f} "
              f"{row['raw_uni'] / 1e9:>13.3f} {row['raw_bidi'] / 1e9:>14.3f} {row['ratio']:>11.2f} "
              f"{busbw / row['raw_uni']:>10.2f} {speedups} {row['into'] / 1e9:>10.3f} "
              f"{100 * row['local'] / row['time']:>7.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 64 MiB, fewer repetitions (< 1 min)")
    parser.add_argument("--wire-mbit", type=float, metavar="RATE",
                        help="run the ranks over a veth pair capped at RATE Mbit/s each way (root only)")
    args = parser.parse_args()
    if args.wire_mbit is None:
        _run(args.quick, None)
    elif (reason := unavailable()) is not None:
        print(f"--wire-mbit skipped: {reason}")
    else:
        with capped_wire(args.wire_mbit) as namespaces:
            _run(args.quick, namespaces)


def _run(quick: bool, namespaces: tuple[str, str] | None) -> None:
    """Run both ranks (in ``namespaces``, one each, when given), print the table and the RESULT lines."""
    context = multiprocessing.get_context("spawn")
    addresses, results = context.Queue(), context.Queue()
    peer_queues = [context.Queue() for _ in range(WORLD_SIZE)]
    secret = secrets.token_bytes(32)
    processes = [
        context.Process(target=_rank_main, args=(rank, secret, quick, namespaces and namespaces[rank], addresses,
                                                 peer_queues[rank], results))
        for rank in range(WORLD_SIZE)]
    for process in processes:
        process.start()
    published = sorted(addresses.get(timeout=60) for _ in range(WORLD_SIZE))
    for peer_queue in peer_queues:
        peer_queue.put(([ring for _, ring, _ in published], [raw for _, _, raw in published]))
    rows = []
    while (row := results.get(timeout=600)) is not None:
        rows.append(row)
    for process in processes:
        process.join(60)
    _print_table(rows)
    at_64mib = next(row for row in rows if row["size"] == 64 * MIB)
    prefix = "" if namespaces is None else "wire_"
    print(f"RESULT {prefix}bf16_speedup_64MiB={at_64mib['time'] / at_64mib['bf16']:.3f}")
    print(f"RESULT {prefix}busbw_ratio_64MiB={at_64mib['ratio']:.3f}")


if __name__ == "__main__":
    main()
