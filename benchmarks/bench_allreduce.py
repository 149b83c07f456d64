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

Run ``python benchmarks/bench_allreduce.py [--quick]`` (``--quick`` stops at
64 MiB with fewer repetitions and takes well under a minute).
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
from sparktf.collective.transport import configure_socket

KIB, MIB = 1 << 10, 1 << 20
WORLD_SIZE = 2
ROUNDS = 5


def _sizes(quick: bool) -> list[int]:
    top = 64 * MIB if quick else 256 * MIB
    sizes, size = [], 4 * KIB
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

    def exchange(self, data: memoryview) -> None:
        """Both ranks send ``data`` and receive as many bytes at once."""
        self._jobs.put(data)
        self._receive(data.nbytes)
        self._done.get()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()
        self._sock.close()

    def _receive(self, size: int) -> None:
        while size:
            size -= self._sock.recv_into(self._sink[:min(size, self._sink.nbytes)])

    def _send_jobs(self) -> None:
        while (data := self._jobs.get()) is not None:
            self._send(data)
            self._done.put(True)

    def _send(self, data: memoryview) -> None:
        for offset in range(0, data.nbytes, self.PIECE_BYTES):
            self._sock.sendall(data[offset:offset + self.PIECE_BYTES])


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


def _rank_main(rank: int, secret: bytes, quick: bool, addresses, peers_in, results) -> None:
    listener, raw_listener = bind_listener(), bind_listener()
    addresses.put((rank, format_peer(listener), format_peer(raw_listener)))
    peers, raw_peers = peers_in.get()
    raw = RawPair(rank, _raw_socket(rank, raw_peers, raw_listener), max(_sizes(quick)))
    with Communicator.from_peers(rank, peers, secret, timeout=120, listener=listener) as comm:
        for size in _sizes(quick):
            buffer = np.ones(size // 4, dtype=np.float32)
            data = memoryview(buffer).cast("B")
            repetitions = _repetitions(size, quick)
            timings = {"time": [], "raw_uni": [], "raw_bidi": [], **{name: [] for name in WIRE_DTYPES}}
            for _ in range(ROUNDS):  # interleaved rounds, median of each: other jobs share the 2 cores
                timings["time"].append(_timed(lambda: comm.allreduce(buffer, op="mean"), repetitions, comm))
                for name in WIRE_DTYPES:
                    timings[name].append(_timed(lambda: comm.allreduce(buffer, op="mean", compression=name),
                                                repetitions, comm))
                timings["raw_uni"].append(_timed(lambda: raw.one_way(data), repetitions, comm))
                timings["raw_bidi"].append(_timed(lambda: raw.exchange(data), repetitions, comm))
            row = {"size": size, "time": statistics.median(timings["time"]),
                   "raw_uni": size / statistics.median(timings["raw_uni"]),
                   "raw_bidi": size / statistics.median(timings["raw_bidi"]),
                   **{name: statistics.median(timings[name]) for name in WIRE_DTYPES}}
            if rank == 0:
                results.put(row)
    raw.close()
    if rank == 0:
        results.put(None)


def _print_table(rows: list[dict]) -> None:
    print(f"{'size':>10} {'time(us)':>10} {'algbw GB/s':>11} {'busbw GB/s':>11} "
          f"{'raw_uni GB/s':>13} {'raw_bidi GB/s':>14} {'busbw/bidi':>11} {'busbw/uni':>10} "
          + " ".join(f"{name + ' x':>7}" for name in WIRE_DTYPES))
    for row in rows:
        algbw = row["size"] / row["time"]
        busbw = algbw * 2 * (WORLD_SIZE - 1) / WORLD_SIZE
        row["ratio"] = busbw / row["raw_bidi"]
        size = f"{row['size'] // MIB} MiB" if row["size"] >= MIB else f"{row['size'] // KIB} KiB"
        speedups = " ".join(f"{row['time'] / row[name]:>7.2f}" for name in WIRE_DTYPES)
        print(f"{size:>10} {row['time'] * 1e6:>10.1f} {algbw / 1e9:>11.3f} {busbw / 1e9:>11.3f} "
              f"{row['raw_uni'] / 1e9:>13.3f} {row['raw_bidi'] / 1e9:>14.3f} {row['ratio']:>11.2f} "
              f"{busbw / row['raw_uni']:>10.2f} {speedups}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 64 MiB, fewer repetitions (< 1 min)")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    addresses, results = context.Queue(), context.Queue()
    peer_queues = [context.Queue() for _ in range(WORLD_SIZE)]
    secret = secrets.token_bytes(32)
    processes = [
        context.Process(target=_rank_main, args=(rank, secret, args.quick, addresses, peer_queues[rank], results))
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
    print(f"RESULT bf16_speedup_64MiB={at_64mib['time'] / at_64mib['bf16']:.3f}")
    print(f"RESULT busbw_ratio_64MiB={at_64mib['ratio']:.3f}")


if __name__ == "__main__":
    main()
