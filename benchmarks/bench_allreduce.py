"""All-reduce benchmark: 2 ranks on loopback vs a plain socket pair moving the same bytes.

For each size, rank 0 reports (nccl-tests definitions, n = 2 ranks):

* ``time``   mean seconds per ``Communicator.allreduce(op="mean")`` of float32;
* ``algbw``  bytes / time;
* ``busbw``  algbw * 2 (n - 1) / n, the bytes each rank sends and receives per second;
* ``raw_uni``  one socket pair, one process ``sendall``s the bytes, the other
  ``recv_into``s them (one direction busy);
* ``raw_bidi`` the same pair with both processes sending and receiving the
  bytes at once (a sender thread each), which is the traffic a 2-rank ring
  all-reduce has: each rank sends and receives ``bytes`` per call.

``busbw_ratio`` is ``busbw / raw_bidi``: how close the all-reduce gets to the
physical bound of this machine for its traffic pattern; ``raw_uni`` is shown
for reference.  The last line is ``RESULT busbw_ratio_64MiB=<ratio>``.

Run ``python benchmarks/bench_allreduce.py [--quick]`` (``--quick`` stops at
64 MiB with fewer repetitions and takes well under a minute).
"""

from __future__ import annotations

import argparse
import multiprocessing
import secrets
import socket
import threading
import time

import numpy as np

from sparktf.collective import Communicator, bind_listener, format_peer
from sparktf.collective.rendezvous import parse_peer
from sparktf.collective.transport import configure_socket, recv_exact

KIB, MIB = 1 << 10, 1 << 20
WORLD_SIZE = 2


def _sizes(quick: bool) -> list[int]:
    top = 64 * MIB if quick else 256 * MIB
    sizes, size = [], 4 * KIB
    while size <= top:
        sizes.append(size)
        size *= 4
    return sizes


def _repetitions(size: int, quick: bool) -> int:
    budget = (64 if quick else 256) * MIB * 3
    return int(min(200 if quick else 500, max(3, budget // size)))


def _raw_pair(rank: int, peers: list[str], listener: socket.socket) -> socket.socket:
    """A plain authenticated-by-nothing TCP connection between the two benchmark ranks."""
    if rank == 0:
        listener.settimeout(60)
        sock, _ = listener.accept()
    else:
        sock = socket.create_connection(parse_peer(peers[0]), timeout=60)
    listener.close()
    configure_socket(sock, 60)
    return sock


def _raw_uni(rank: int, sock: socket.socket, data: memoryview, sink: memoryview) -> None:
    if rank == 0:
        sock.sendall(data)
        recv_exact(sock, sink[:1])
    else:
        recv_exact(sock, sink)
        sock.sendall(b"k")


def _raw_bidi(sock: socket.socket, data: memoryview, sink: memoryview) -> None:
    sender = threading.Thread(target=sock.sendall, args=(data,))
    sender.start()
    recv_exact(sock, sink)
    sender.join()


def _timed(function, repetitions: int, comm: Communicator) -> float:
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
    raw = _raw_pair(rank, raw_peers, raw_listener)
    with Communicator.from_peers(rank, peers, secret, timeout=120, listener=listener) as comm:
        for size in _sizes(quick):
            buffer = np.ones(size // 4, dtype=np.float32)
            data, sink = memoryview(buffer).cast("B"), memoryview(bytearray(size))
            repetitions = _repetitions(size, quick)
            row = {
                "size": size,
                "time": _timed(lambda: comm.allreduce(buffer, op="mean"), repetitions, comm),
                "raw_uni": size / _timed(lambda: _raw_uni(rank, raw, data, sink), repetitions, comm),
                "raw_bidi": size / _timed(lambda: _raw_bidi(raw, data, sink), repetitions, comm),
            }
            if rank == 0:
                results.put(row)
    raw.close()
    if rank == 0:
        results.put(None)


def _print_table(rows: list[dict]) -> None:
    print(f"{'size':>10} {'time(us)':>10} {'algbw GB/s':>11} {'busbw GB/s':>11} "
          f"{'raw_uni GB/s':>13} {'raw_bidi GB/s':>14} {'busbw/bidi':>11} {'busbw/uni':>10}")
    for row in rows:
        algbw = row["size"] / row["time"]
        busbw = algbw * 2 * (WORLD_SIZE - 1) / WORLD_SIZE
        row["ratio"] = busbw / row["raw_bidi"]
        size = f"{row['size'] // MIB} MiB" if row["size"] >= MIB else f"{row['size'] // KIB} KiB"
        print(f"{size:>10} {row['time'] * 1e6:>10.1f} {algbw / 1e9:>11.3f} {busbw / 1e9:>11.3f} "
              f"{row['raw_uni'] / 1e9:>13.3f} {row['raw_bidi'] / 1e9:>14.3f} {row['ratio']:>11.2f} "
              f"{busbw / row['raw_uni']:>10.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="sizes up to 64 MiB, fewer repetitions (< 1 min)")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    addresses, results = context.Queue(), context.Queue()
    peer_queues = [context.Queue() for _ in range(WORLD_SIZE)]
    secret = secrets.token_bytes(32)
    processes = [context.Process(target=_rank_main, args=(rank, secret, args.quick, addresses, peer_queues[rank], results))
                 for rank in range(WORLD_SIZE)]
    for process in processes:
        process.start()
    published = sorted(addresses.get(timeout=60) for _ in range(WORLD_SIZE))
    for queue in peer_queues:
        queue.put(([ring for _, ring, _ in published], [raw for _, _, raw in published]))
    rows = []
    while (row := results.get(timeout=600)) is not None:
        rows.append(row)
    for process in processes:
        process.join(60)
    _print_table(rows)
    ratio = next(row["ratio"] for row in rows if row["size"] == 64 * MIB)
    print(f"RESULT busbw_ratio_64MiB={ratio:.3f}")


if __name__ == "__main__":
    main()
