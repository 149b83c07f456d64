"""Data-layer benchmark: the columnar paths next to the per-record paths they replace.

* ``dataframe``: ``TFDataset.from_dataframe`` (Arrow record batches -> Blocks)
  vs ``TFDataset.from_rdd(df.rdd.map(...))`` (one Python Row per record), both
  reading the same cached DataFrame and counting the resulting Blocks, for a
  64-float array column and for 16 double columns.
  ``RESULT dataframe_<case>_arrow_speedup`` is per-row time / Arrow time (for
  arrays, Spark's own JVM row -> Arrow conversion is most of the Arrow time).
* ``train_batches``: ``batching.TrainBatches`` (shuffled, wrap-around) vs
  ``tf.data.Dataset.from_tensor_slices(...).shuffle(n).repeat().batch(b)`` on
  the same in-memory shard. ``RESULT train_batches_vs_tf_data`` is tf.data
  time / TrainBatches time for the same number of batches.

Both are measured side by side in one run, best of a few interleaved rounds.
Run ``python benchmarks/bench_dataset.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROUNDS = 3
SPARK_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
    "spark.driver.memory": "4g",
}


def seconds(run) -> float:
    """Wall time of one call of ``run``."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def bench_dataframe(quick: bool) -> dict:
    """Arrow vs per-row reading of a float-array column and of many scalar columns."""
    import sparktf

    spark = sparktf.init_spark("local[2]", app_name="bench_dataset", conf=SPARK_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    rows = 40_000 if quick else 200_000
    width, scalars = 64, 16
    ids = spark.range(0, rows, numPartitions=2)
    array_df = ids.selectExpr(f"transform(sequence(1, {width}), i -> cast(id * i as float)) as x", "id % 10 as y")
    scalar_df = ids.selectExpr(*[f"cast(id * {i} as double) as c{i}" for i in range(scalars)], "id % 10 as y")
    cases = {
        "array": (array_df, "x", ("float32", [width]), lambda row: (row.x, row.y)),
        "scalars": (scalar_df, [f"c{i}" for i in range(scalars)], [("float32", [])] * scalars,
                    lambda row: (list(row)[:-1], row[-1])),
    }
    ratios = {}
    for name, (df, columns, spec, to_record) in cases.items():
        arrow, per_row = _compare_dataframe_paths(df.cache(), columns, spec, to_record, rows)
        print(f"dataframe {name} rows={rows}: arrow {arrow:.2f}s ({rows / arrow:,.0f} rec/s), "
              f"per-row {per_row:.2f}s ({rows / per_row:,.0f} rec/s)")
        ratios[name] = per_row / arrow
        df.unpersist()
    spark.stop()
    return ratios


def _compare_dataframe_paths(df, columns, spec, to_record, rows):
    from sparktf import TFDataset

    df.count()

    def arrow_path():
        assert TFDataset.from_dataframe(df, columns, "y").num_records == rows

    def row_path():
        assert TFDataset.from_rdd(df.rdd.map(to_record), spec, ("int64", [])).num_records == rows

    arrow_path(), row_path()  # warm up the Python workers of both paths
    rounds = [(seconds(arrow_path), seconds(row_path)) for _ in range(ROUNDS)]  # interleaved
    return min(arrow for arrow, _ in rounds), min(row for _, row in rounds)


def bench_train_batches(quick: bool) -> float:
    import tensorflow as tf

    from sparktf.batching import Shard, TrainBatches

    records, batch = (20_000, 64) if quick else (100_000, 128)
    steps = 2 * records // batch  # two passes, crossing pass boundaries
    rng = np.random.default_rng(0)
    shard = Shard([rng.random((records, 28, 28, 1), dtype=np.float32), rng.integers(0, 10, records)])

    def sparktf_batches():
        batches = TrainBatches(shard, batch, shuffle=True, seed=1, rank=0)
        for _ in range(steps):
            next(batches)

    def tf_data_batches():
        data = tf.data.Dataset.from_tensor_slices(tuple(shard.arrays))
        iterator = iter(data.shuffle(records, seed=1).repeat().batch(batch))
        for _ in range(steps):
            next(iterator)

    sparktf_batches(), tf_data_batches()
    rounds = [(seconds(sparktf_batches), seconds(tf_data_batches)) for _ in range(ROUNDS)]  # interleaved
    ours, theirs = min(r[0] for r in rounds), min(r[1] for r in rounds)
    print(f"train_batches records={records} batch={batch} steps={steps}: TrainBatches {ours:.3f}s, "
          f"tf.data {theirs:.3f}s")
    return theirs / ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data, well under a minute of work")
    args = parser.parse_args()
    batches_ratio = bench_train_batches(args.quick)
    dataframe_ratios = bench_dataframe(args.quick)
    print(f"RESULT train_batches_vs_tf_data={batches_ratio:.2f}")
    for name, ratio in dataframe_ratios.items():
        print(f"RESULT dataframe_{name}_arrow_speedup={ratio:.2f}")


if __name__ == "__main__":
    main()
