"""Peak anonymous memory (``RssAnon``) of this machine's PySpark Python workers, sampled from /proc.

Used by tests and ``benchmarks/bench_input.py`` to check that a training
worker's memory stays within ``spark.sparktf.trainDataMemory`` (plus what
TensorFlow and the model take).
"""

from __future__ import annotations

import os
import threading
from typing import Dict


def _parents() -> Dict[int, int]:
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                parents[int(pid)] = int(stat.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
    return parents


def _descends_from(pid: int, ancestor: int, parents: Dict[int, int]) -> bool:
    while pid > 1:
        pid = parents.get(pid, 0)
        if pid == ancestor:
            return True
    return False


def python_workers() -> Dict[int, int]:
    """``{pid: RssAnon bytes}`` of this process's Spark Python workers (and their daemon: PySpark's or sparktf's)."""
    found = {}
    parents = _parents()
    for pid in parents:
        if not _descends_from(pid, os.getpid(), parents):
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                arguments = cmdline.read().split(b"\0")
                if not {b"pyspark.daemon", b"sparktf.spark.tf_daemon"} & set(arguments):
                    continue
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("RssAnon:"):
                        found[int(pid)] = int(line.split()[1]) * 1024
        except OSError:  # the process ended meanwhile
            continue
    return found


class PeakSampler:
    """Samples :func:`python_workers` every ``interval`` seconds on a thread; ``peak`` is the largest seen, ``peaks``
    the largest of each process."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self.peak = 0
        self.peaks: Dict[int, int] = {}  # per worker process
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid, rss in python_workers().items():
                self.peaks[pid] = max(self.peaks.get(pid, 0), rss)
            self.peak = max([self.peak, *self.peaks.values()])
            self._stop.wait(self.interval)
