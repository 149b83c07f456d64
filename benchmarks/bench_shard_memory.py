"""Sharded tables' memory: each worker's peak RssAnon training NCF with Adam on 4 workers, sharded and not.

NCF shaped like MovieLens-20M (``bench_sparse.py``'s: 138,493 users and
26,744 items, embeddings of 32 and 64, four tables of 63.4 MB in all) with
Adam, whose two slots per row add 126.9 MB. On ``local-cluster[4,1,1024]``
(four executors of one core each), three ``optimize`` runs, each on 4
workers in a Spark session of its own (fresh Python workers):

* **replicated**: every worker holds the tables and their slots whole;
* **sharded** (``spark.sparktf.shardTableBytes=1m``: the four tables): each
  worker holds a quarter of every table and of its slots;
* **base**: the same model with tables of 1,024 rows: what a worker takes
  without the tables (TensorFlow, the MLP, the input).

Each prints the four busiest Python workers' peak RssAnon, and the bytes of
the driver's optimizer variables (sharded: no slot of a sharded table). The
tables' and slots' share of a worker's peak is its peak less the base's; the
goal is that the sharded share is about a quarter of the replicated one.

Last line::

    RESULT shard_memory_share=<sharded share / replicated share>

Run ``flock /tmp/sparktf-bench.lock python benchmarks/bench_shard_memory.py`` (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_sparse and worker_memory beside this file

from bench_sparse import GLOBAL_BATCH, ITEMS, USERS, build_model, make_data  # noqa: E402
from worker_memory import PeakSampler  # noqa: E402

WORKERS, ITERATIONS, BASE_ROWS = 4, 20, 1024


def peaks(shard: bool, rows) -> tuple:
    """The ``WORKERS`` largest per-process peak RssAnon (bytes) of a ``WORKERS``-worker NCF-Adam ``optimize``, and
    the bytes of the driver's optimizer variables after it."""
    from pyspark import SparkContext

    from sparktf import MaxIteration, TFDataset, TFOptimizer

    SparkContext.getOrCreate().setLocalProperty("spark.sparktf.shardTableBytes", "1m" if shard else None)
    dataset = TFDataset.from_ndarrays(make_data("ncf", GLOBAL_BATCH * ITERATIONS, rows), batch_size=GLOBAL_BATCH,
                                      num_partitions=WORKERS, shuffle=False)
    trainer = TFOptimizer.from_keras(build_model("ncf", "adam", rows), dataset, num_workers=WORKERS)
    with PeakSampler(interval=0.1) as memory:
        trainer.optimize(end_trigger=MaxIteration(ITERATIONS), verbose=0)
    assert trainer.last_traffic.sharded_tables == (4 * ITERATIONS if shard else 0), trainer.last_traffic
    driver = sum(int(np.prod(v.shape)) * 4 for v in trainer.model.optimizer.variables)
    return sorted(memory.peaks.values(), reverse=True)[:WORKERS], driver


def wait_for_executors(sc, count: int, timeout: float) -> None:
    """Wait until the session has ``count`` task slots (a new local-cluster's executors register after it starts)."""
    from sparktf.spark.cluster import total_task_slots

    deadline = time.monotonic() + timeout
    while total_task_slots(sc) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{count} executors did not register within {timeout} s")
        time.sleep(0.5)


def main() -> None:
    import sparktf

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tables = (USERS + ITEMS) * (32 + 64) * 4
    print(f"NCF-Adam on local-cluster[{WORKERS},1,1024], global batch {GLOBAL_BATCH}, {ITERATIONS} iterations; "
          f"tables {tables / 2**20:.1f} MB, Adam's slots {2 * tables / 2**20:.1f} MB")
    runs = {}
    for name, shard, rows in (("base", False, (BASE_ROWS, BASE_ROWS)), ("replicated", False, (USERS, ITEMS)),
                              ("sharded", True, (USERS, ITEMS))):
        # a session of its own: fresh executors and Python workers, which keep nothing of another run's
        spark = sparktf.init_spark(f"local-cluster[{WORKERS},1,1024]", app_name="bench-shard-memory", conf={
            "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false", "spark.executor.memory": "512m",
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.scheduler.minRegisteredResourcesRatio": "1.0"})
        spark.sparkContext.setLogLevel("ERROR")
        try:
            wait_for_executors(spark.sparkContext, WORKERS, timeout=120)
            runs[name], driver = peaks(shard, rows)
        finally:
            spark.stop()
        print(f"{name:10s} peak RssAnon per worker: {', '.join(f'{p / 2**20:.0f}' for p in runs[name])} MB; "
              f"the driver's optimizer variables {driver / 2**20:.1f} MB")
    base = max(runs["base"])
    share = {name: max(runs[name]) - base for name in ("replicated", "sharded")}
    print(f"tables' and slots' share of a worker's peak (peak less base {base / 2**20:.0f} MB): "
          f"replicated {share['replicated'] / 2**20:.0f} MB, sharded {share['sharded'] / 2**20:.0f} MB")
    print(f"RESULT shard_memory_share={share['sharded'] / share['replicated']:.3f}")


if __name__ == "__main__":
    main()
