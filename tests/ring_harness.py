"""Real processes joined in a collective ring on loopback, each running a scenario: the tests' harness."""

from __future__ import annotations

import multiprocessing
import secrets
import threading

from sparktf.collective import bind_listener, format_peer

CONTEXT = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(["numpy", "sparktf.collective"])
JOIN_SECONDS = 60
# How long results() waits for the ranks' reports: a scenario may train many cases (test_sparse_gradients' 13 took
# 31 s alone and over 60 s beside the suite's other worker on 2 cores).
RESULTS_SECONDS = 240


def collective_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("sparktf")]


def _child(scenario, rank, secret, addresses, peer_queue, results, options):
    listener = bind_listener("127.0.0.1")
    addresses.put((rank, format_peer(listener)))
    peers = peer_queue.get()
    try:
        value, error = scenario(rank, peers, listener, secret, **options), None
    except BaseException as exc:  # reported to the test process, which asserts on it
        value, error = None, f"{type(exc).__name__}: {exc}"
    results.put((rank, value, error, collective_threads()))


class Ranks:
    """``world_size`` processes running ``scenario(rank, peers, listener, secret, **options)``."""

    def __init__(self, world_size, scenario, secret=None, **options):
        self.world_size = world_size
        self.secret = secret or secrets.token_bytes(32)
        self._addresses, self._results = CONTEXT.Queue(), CONTEXT.Queue()
        self._peer_queues = [CONTEXT.Queue() for _ in range(world_size)]
        self.processes = [
            CONTEXT.Process(target=_child, args=(scenario, rank, self.secret, self._addresses,
                                                 self._peer_queues[rank], self._results, options), daemon=True)
            for rank in range(world_size)]
        for process in self.processes:
            process.start()
        published = dict(self._addresses.get(timeout=JOIN_SECONDS) for _ in range(world_size))
        self.peers = [published[rank] for rank in range(world_size)]

    def connect(self):
        for queue in self._peer_queues:
            queue.put(self.peers)

    def results(self, count=None):
        """``{rank: (value, error, collective thread names)}`` of ``count`` ranks (default all)."""
        reports = {}
        for _ in range(self.world_size if count is None else count):
            rank, value, error, threads = self._results.get(timeout=RESULTS_SECONDS)
            reports[rank] = (value, error, threads)
        return reports

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        for process in self.processes:
            process.join(JOIN_SECONDS)
            if process.is_alive():
                process.kill()
                process.join()


def run_ranks(world_size, scenario, **options):
    with Ranks(world_size, scenario, **options) as ranks:
        ranks.connect()
        reports = ranks.results()
    for rank, (_, error, threads) in reports.items():
        assert error is None, f"rank {rank}: {error}"
        assert threads == [], f"rank {rank} left threads running: {threads}"
    return [reports[rank][0] for rank in range(world_size)]


