"""Feed benchmark: records/s delivered as training batches, next to a plain NumPy slicing loop.

For 28x28x1 and 32x32x3 float32 records (with an integer label), in one run:

* ``iterator``: ``train_batches.TrainBatches`` over an in-memory ``Shard`` (shuffled,
  as in training, and unshuffled) vs a plain NumPy loop slicing the same
  arrays in batches of the same size and copying each batch out (what the
  iterator delivers: arrays the consumer owns; the bare-view loop moves no
  data and is printed only for reference). ``iterator_vs_numpy`` is NumPy
  records/s / shuffled iterator records/s (goal: <= 2).
* ``feed``: end-to-end records/s of one Spark job per factory that builds
  and caches the Blocks and iterates one pass of training batches in every
  partition (``block_rdd.mapPartitions(...)``): ``from_rdd`` of a cached RDD
  of ``(ndarray, int)`` records, ``from_dataframe`` of a cached DataFrame
  with a flat ``array<float>`` column (Arrow), ``from_ndarrays`` of driver
  arrays, and the per-row Python conversion
  ``from_rdd(df.rdd.map(lambda row: (np.asarray(row.x, np.float32), row.y)))``
  of the same DataFrame. ``arrow_vs_per_row`` is Arrow records/s / per-row
  records/s (goal: >= 5); ``arrow_vs_per_row_blocks_only`` is the same for a
  job that only builds, caches and counts the blocks (the conversion itself,
  as bench_dataset.py measured it); ``feed_ratio_dataframe`` is Arrow
  records/s / the NumPy bound, for 28x28x1 on the last line.

Every rate is the best of a few interleaved rounds. Run
``python benchmarks/bench_feed.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Callable, Dict

import numpy as np

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SHAPES = {"28x28x1": (28, 28, 1), "32x32x3": (32, 32, 3)}
BATCH = 128
PARTITIONS = 2
SPARK_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
    "spark.driver.memory": "4g",
}


def best_rates(cases: Dict[str, Callable[[], int]], rounds: int) -> Dict[str, float]:
    """Records/s of each case (a call returning its record count), best of ``rounds`` interleaved rounds."""
    best = {name: 0.0 for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():
            start = time.perf_counter()
            records = run()
            best[name] = max(best[name], records / (time.perf_counter() - start))
    return best


def numpy_slicing(x: np.ndarray, y: np.ndarray, copy: bool = True) -> int:
    """One pass of plain NumPy slicing in batches of :data:`BATCH` (copying each batch out when ``copy``)."""
    stop = len(x) - len(x) % BATCH
    for start in range(0, stop, BATCH):
        batch = x[start : start + BATCH], y[start : start + BATCH]
        if copy:
            batch = [array.copy() for array in batch]
    return stop


def train_batches(shard, shuffle: bool) -> int:
    """One pass of ``TrainBatches`` over ``shard``; the number of records delivered."""
    from sparktf.data.train_batches import TrainBatches

    steps = shard.num_records // BATCH
    batches = TrainBatches(shard, BATCH, shuffle=shuffle, seed=1, rank=0, sequential_order=True)
    for _ in range(steps):
        next(batches)
    return steps * BATCH


def bench_iterator(x: np.ndarray, y: np.ndarray, rounds: int) -> Dict[str, float]:
    """Records/s of NumPy slicing (views, copies) and of ``TrainBatches`` on the same arrays."""
    from sparktf.data.batching import Shard

    shard = Shard([x, y])
    return best_rates(
        {
            "numpy views": lambda: numpy_slicing(x, y, copy=False),
            "numpy": lambda: numpy_slicing(x, y),
            "TrainBatches shuffled": lambda: train_batches(shard, shuffle=True),
            "TrainBatches unshuffled": lambda: train_batches(shard, shuffle=False),
        },
        rounds,
    )


def partition_batches(blocks) -> list:
    """``mapPartitions`` function: one training pass over a partition's blocks; ``[records delivered]``."""
    from sparktf.data.batching import Shard

    return [train_batches(Shard.from_blocks(blocks), shuffle=True)]


def partition_records(blocks) -> list:
    """``mapPartitions`` function: ``[records in the partition's blocks]``, without batching."""
    return [sum(len(block[0]) for block in blocks)]


def consumed_records(dataset, consume=partition_batches) -> int:
    """Build and cache ``dataset``'s blocks and ``consume`` every partition in one Spark job; drop the cache."""
    block_rdd = dataset.block_rdd
    records = sum(block_rdd.mapPartitions(consume).collect())
    for java_rdd in block_rdd.context._jsc.getPersistentRDDs().values():
        if (java_rdd.name() or "").startswith("sparktf "):  # the blocks, or from_dataframe's Arrow batches
            java_rdd.unpersist(False)
    return records


def warm_up_workers() -> None:
    """Start the Python workers and import sparktf in them, so the first timed job does not pay for it."""
    from sparktf import TFDataset

    consumed_records(TFDataset.from_ndarrays((np.zeros((2 * BATCH, 4), np.float32),), num_partitions=PARTITIONS))


def bench_factories(spark, shape, x: np.ndarray, y: np.ndarray, rounds: int) -> Dict[str, float]:
    """End-to-end records/s of each factory for records of ``shape`` (``x``, ``y`` are the driver's copy)."""
    from sparktf import TFDataset

    size = int(np.prod(shape))
    frame = spark.range(0, len(x), numPartitions=PARTITIONS).selectExpr(
        f"transform(sequence(1, {size}), i -> cast((id * i) % 255 / 255 as float)) as x", "cast(id % 10 as int) as y"
    ).cache()
    records = spark.sparkContext.range(0, len(x), numSlices=PARTITIONS).map(
        lambda i: (np.full(shape, i % 255 / 255, np.float32), i % 10)
    ).cache()
    assert frame.count() == records.count() == len(x)

    def arrow(consume=partition_batches):
        return consumed_records(TFDataset.from_dataframe(frame, "x", "y"), consume)

    def per_row(consume=partition_batches):
        rows = frame.rdd.map(lambda row: (np.asarray(row.x, np.float32), row.y))
        return consumed_records(TFDataset.from_rdd(rows, ("float32", [size]), ("int32", [])), consume)

    rates = best_rates(
        {
            "from_rdd": lambda: consumed_records(TFDataset.from_rdd(records, ("float32", shape), ("int64", []))),
            "from_dataframe (Arrow)": arrow,
            "from_ndarrays": lambda: consumed_records(TFDataset.from_ndarrays((x, y), num_partitions=PARTITIONS)),
            "per-row df.rdd": per_row,
            "Arrow, blocks only": lambda: arrow(partition_records),
            "per-row, blocks only": lambda: per_row(partition_records),
        },
        rounds,
    )
    frame.unpersist()
    records.unpersist()
    return rates


def report(title: str, rates: Dict[str, float], bound: float) -> None:
    """Print each rate and its ratio to the NumPy ``bound``."""
    print(title)
    for name, rate in rates.items():
        print(f"  {name:<26}{rate:>14,.0f} records/s  ({rate / bound:.4f} x NumPy)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data and fewer rounds (under a minute)")
    args = parser.parse_args()
    import sparktf

    spark = sparktf.init_spark(f"local[{PARTITIONS}]", app_name="bench_feed", conf=SPARK_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    rounds = 2 if args.quick else 3
    warm_up_workers()
    results = []
    for name, shape in SHAPES.items():
        n = (40 if args.quick else 250) * 2**20 // (4 * int(np.prod(shape)))  # the same bytes for each shape
        rng = np.random.default_rng(0)
        x, y = rng.random((n,) + shape, dtype=np.float32), rng.integers(0, 10, n)
        iterator = bench_iterator(x, y, rounds=3)
        bound = iterator["numpy"]
        report(f"{name}: {n} records, batch {BATCH}, in-process iterator", iterator, bound)
        feed = bench_factories(spark, shape, x, y, rounds)
        report(f"{name}: end to end, {PARTITIONS} partitions (local[{PARTITIONS}])", feed, bound)
        results += [
            (f"iterator_vs_numpy_{name}", bound / iterator["TrainBatches shuffled"]),
            (f"arrow_vs_per_row_{name}", feed["from_dataframe (Arrow)"] / feed["per-row df.rdd"]),
            (f"arrow_vs_per_row_blocks_only_{name}", feed["Arrow, blocks only"] / feed["per-row, blocks only"]),
            (f"feed_ratio_dataframe_{name}", feed["from_dataframe (Arrow)"] / bound),
        ]
    spark.stop()
    for key, value in results:
        print(f"RESULT {key}={value:.4g}")
    print(f"RESULT feed_ratio_dataframe={dict(results)['feed_ratio_dataframe_28x28x1']:.4g}")


if __name__ == "__main__":
    main()
