"""Two real slowdowns made from outside sparktf, and what the step anatomy says of them (needs root, Linux).

A Spark standalone cluster of two 1-core workers trains a model of 789k
parameters (3.2 MB of gradients) with 2 ranks, first healthy and then with
one worker slowed from outside:

* ``slow-link``: worker 1 runs in a network namespace joined to the host by a
  veth pair (another machine, on private addresses that stay on this one);
  ``tc tbf`` caps the namespace's side of the link (``--rate``, 50mbit).
* ``cpu-quota``: worker 1's processes run in a cgroup (v1) with
  ``cpu.cfs_quota_us=30000`` of 100000, what a Kubernetes CPU limit does
  (in the namespace too, its link not capped, so that its host names it).

It prints each run's call time, the stragglers sparktf named (with the time
from the call's start), each rank's ``rank_timings``, and::

    RESULT <setup>_healthy_named_nobody=<1 when the healthy run named nobody>
    RESULT <setup>_lost_over_slowdown=<the slowed rank's lost_seconds / (slowed call - healthy call)>
    RESULT <setup>_named=<1 when the slowed rank is named first, in the expected phase>

``--record PATH`` writes both runs' step rows (``healthy_<rank>``,
``slowed_<rank>``) and the slowed rank (``slowed_rank``) for
``tests/test_step_anatomy.py``.

Run ``sudo python benchmarks/straggler_setups.py slow-link`` (or ``cpu-quota``).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
from record_step_timings import recorded_anatomy  # beside this script

NAMESPACE, HOST_SIDE, SLOW_SIDE = "sparktf-slow", "10.77.0.1", "10.77.0.2"
CGROUP = "/sys/fs/cgroup/cpu/sparktf-quota"
EXPECTED_PHASE = {"slow-link": "exchange", "cpu-quota": "compute"}


def run(*argv: str) -> None:
    subprocess.run(argv, check=True)


@contextlib.contextmanager
def network_namespace() -> Iterator[Tuple[str, List[str]]]:
    """A namespace behind a veth pair (the host at ``HOST_SIDE``); yields the slowed side's address and its command
    prefix, and caps the link only inside :func:`link_cap`."""
    run("ip", "netns", "add", NAMESPACE)
    try:
        run("ip", "link", "add", "veth-sparktf", "type", "veth", "peer", "name", "veth-slow")
        run("ip", "link", "set", "veth-slow", "netns", NAMESPACE)
        run("ip", "addr", "add", f"{HOST_SIDE}/24", "dev", "veth-sparktf")
        run("ip", "link", "set", "veth-sparktf", "up")
        inside = ["ip", "netns", "exec", NAMESPACE]
        run(*inside, "ip", "addr", "add", f"{SLOW_SIDE}/24", "dev", "veth-slow")
        run(*inside, "ip", "link", "set", "veth-slow", "up")
        run(*inside, "ip", "link", "set", "lo", "up")
        yield SLOW_SIDE, inside
    finally:
        subprocess.run(["ip", "link", "del", "veth-sparktf"], check=False)
        subprocess.run(["ip", "netns", "del", NAMESPACE], check=False)


@contextlib.contextmanager
def link_cap(rate: str) -> Iterator[None]:
    run("ip", "netns", "exec", NAMESPACE, "tc", "qdisc", "add", "dev", "veth-slow", "root", "tbf", "rate", rate,
        "burst", "64kb", "latency", "500ms")
    try:
        yield
    finally:
        run("ip", "netns", "exec", NAMESPACE, "tc", "qdisc", "del", "dev", "veth-slow", "root")


@contextlib.contextmanager
def cpu_cgroup() -> Iterator[List[str]]:
    """A cgroup without a quota yet (:func:`cpu_quota` sets it); yields a command prefix that starts a process
    inside it."""
    os.makedirs(CGROUP, exist_ok=True)
    try:
        yield ["sh", "-c", f'echo $$ > {CGROUP}/cgroup.procs && exec "$@"', "in-cgroup"]
    finally:
        with open(f"{CGROUP}/cgroup.procs") as procs:
            for pid in procs.read().split():
                with contextlib.suppress(OSError):
                    with open("/sys/fs/cgroup/cpu/cgroup.procs", "w") as root:
                        root.write(pid)
        with contextlib.suppress(OSError):
            os.rmdir(CGROUP)


@contextlib.contextmanager
def cpu_quota(quota_us: int) -> Iterator[None]:
    with open(f"{CGROUP}/cpu.cfs_quota_us", "w") as quota:
        quota.write(str(quota_us))
    try:
        yield
    finally:
        with open(f"{CGROUP}/cpu.cfs_quota_us", "w") as quota:
            quota.write("-1")


@contextlib.contextmanager
def standalone_cluster(host: str, slowed_address: str, slowed_prefix: List[str], folder: str) -> Iterator[str]:
    """A master and a worker on ``host``, and a worker at ``slowed_address`` started with ``slowed_prefix``; yields
    the master's URL once both workers are alive."""
    import pyspark

    spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
    processes: List[subprocess.Popen] = []

    def start(argv: List[str], address: str, log: str) -> subprocess.Popen:
        env = dict(os.environ, SPARK_LOCAL_IP=address, SPARK_WORKER_DIR=os.path.join(folder, "work"),
                   PYSPARK_PYTHON=sys.executable)
        process = subprocess.Popen(argv, stdout=open(os.path.join(folder, log), "w"), stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
        processes.append(process)
        return process

    def logged(log: str, pattern: str) -> str:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            match = re.search(pattern, open(os.path.join(folder, log)).read())
            if match:
                return match.group(1)
            time.sleep(0.5)
        raise TimeoutError(f"{pattern!r} not in {log} within 90 s")

    try:
        start([spark_class, "org.apache.spark.deploy.master.Master", "--host", host, "--port", "0",
               "--webui-port", "0"], host, "master.log")
        master = logged("master.log", r"Starting Spark master at (spark://\S+)")
        worker = ["org.apache.spark.deploy.worker.Worker", "--cores", "1", "--memory", "2g", "--webui-port", "0"]
        start([spark_class, *worker, "--host", host, master], host, "worker0.log")
        start([*slowed_prefix, spark_class, *worker, "--host", slowed_address, master], slowed_address,
              "worker1.log")
        for log in ("worker0.log", "worker1.log"):
            logged(log, r"(Successfully registered with master)")
        yield master
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in processes:  # reaped: a zombie would keep the cgroup from being removed
            process.wait(timeout=30)


class _NamedAt(logging.Handler):
    """Keeps the seconds since ``started`` at which each straggler warning was logged."""

    def __init__(self, started: float) -> None:
        super().__init__(logging.WARNING)
        self.started, self.named = started, []

    def emit(self, record: logging.LogRecord) -> None:
        if "slower than" in record.getMessage():
            self.named.append((round(time.monotonic() - self.started, 1), record.getMessage().split(":")[0]))


def train(iterations: int) -> Dict[str, Any]:
    """One call of ``iterations`` on 2 workers: its seconds of steps (the slowest rank's), when each straggler was
    named, and what the anatomy said."""
    import keras

    from sparktf import MaxIteration, TFDataset, TFOptimizer

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64 * 2 * 40, 256)).astype(np.float32)
    y = rng.normal(size=(len(x), 1)).astype(np.float32)
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, "relu"), keras.layers.Dense(512, "relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    optimizer = TFOptimizer.from_keras(model, TFDataset.from_ndarrays((x, y), batch_size=128), num_workers=2)
    watch = _NamedAt(time.monotonic())
    logging.getLogger("sparktf.optimizer").addHandler(watch)
    try:
        with recorded_anatomy() as records:
            optimizer.optimize(MaxIteration(iterations), verbose=0)
    finally:
        logging.getLogger("sparktf.optimizer").removeHandler(watch)
    timings = optimizer.rank_timings
    phases = ("data", "lookup", "compute", "exchange_wait", "transfer", "apply")
    return {"seconds": max(sum(t[p] for p in phases) for t in timings.values()), "named_at": watch.named,
            "stragglers": optimizer.stragglers, "timings": timings, "params": model.count_params(),
            "records": records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("setup", choices=sorted(EXPECTED_PHASE))
    parser.add_argument("--rate", default="50mbit")
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--folder", default="/tmp/sparktf-straggler-setups")
    parser.add_argument("--record", metavar="PATH", help="write both runs' step rows to this .npz")
    args = parser.parse_args()
    os.makedirs(args.folder, exist_ok=True)
    slow = link_cap(args.rate) if args.setup == "slow-link" else cpu_quota(30000)
    with contextlib.ExitStack() as stack:
        slowed_address, prefix = stack.enter_context(network_namespace())
        if args.setup == "cpu-quota":
            prefix = stack.enter_context(cpu_cgroup()) + prefix  # into the cgroup first: the namespace's /sys has none
        master = stack.enter_context(standalone_cluster(HOST_SIDE, slowed_address, prefix, args.folder))
        from pyspark.sql import SparkSession

        os.environ["SPARK_LOCAL_IP"] = HOST_SIDE  # the driver listens where the namespace's worker reaches it
        os.environ["PYSPARK_PYTHON"] = sys.executable

        spark = (SparkSession.builder.master(master).config("spark.driver.host", HOST_SIDE)
                 .config("spark.driver.bindAddress", HOST_SIDE).config("spark.cores.max", "2")
                 .config("spark.scheduler.minRegisteredResourcesRatio", "1.0").config("spark.ui.enabled", "false")
                 .getOrCreate())
        train(10)  # start-up: workers' TensorFlow imports, traces
        healthy = train(args.iterations)
        with slow:
            slowed = train(args.iterations)
        spark.stop()
    for name, result in (("healthy", healthy), ("slowed", slowed)):
        print(f"{name}: {result['seconds']:.2f} s of steps ({result['params']} parameters); stragglers: "
              f"{[s.describe() for s in result['stragglers']]}; named live at (s, who): {result['named_at']}")
        for rank, timings in sorted(result["timings"].items()):
            print(f"  rank {rank}: " + ", ".join(f"{phase} {seconds:.3f}" for phase, seconds in timings.items()))
    slowed_host = SLOW_SIDE
    named = [(s.host, s.phase) for s in slowed["stragglers"]]
    slowdown = slowed["seconds"] - healthy["seconds"]
    lost = max((s.lost_seconds for s in slowed["stragglers"] if s.host == slowed_host), default=0.0)
    print(f"slowdown {slowdown:.2f} s, the slowed rank's lost seconds {lost:.2f}; healthy run named "
          f"{[(s.rank, s.phase) for s in healthy['stragglers']]}")
    if args.record:
        rows = {f"{name}_{rank}": np.concatenate([r.steps for r in result["records"] if r.rank == rank])
                for name, result in (("healthy", healthy), ("slowed", slowed)) for rank in (0, 1)}  # segments in order
        slowed_rank = next(record.rank for record in slowed["records"] if record.host == slowed_host)
        np.savez_compressed(args.record, slowed_rank=slowed_rank, **rows)
    key = args.setup.replace("-", "_")
    print(f"RESULT {key}_healthy_named_nobody={int(not healthy['stragglers'])}")
    print(f"RESULT {key}_lost_over_slowdown={lost / slowdown if slowdown > 0 else float('nan'):.3f}")
    print(f"RESULT {key}_named={int(named[:1] == [(slowed_host, EXPECTED_PHASE[args.setup])])}")


if __name__ == "__main__":
    main()
