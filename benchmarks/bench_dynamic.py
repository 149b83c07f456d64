"""Online CTR with churning ids: ``DynamicEmbedding`` against hashing and an unbounded table, on one stream.

The stream: ``FILES`` parquet files (one a micro-batch) of ``RECORDS`` click
events. Each event's id is Zipf(1.1)-distributed over ranks whose popular set
drifts (the rank's id moves by ``DRIFT`` every file), so the run sees about
10x more distinct ids than ``CAPACITY``; a click follows a hidden per-id rule
(a bias drawn from a hash of the id). Three models of one architecture (the
id's vector of 8 -> a sigmoid) train on it with ``optimize_stream``
(``availableNow``, a resident job, test-then-train), at equal table memory:

* ``dynamic``: ``DynamicEmbedding(8, CAPACITY, admit_after=2, evict={"ttl_steps": TTL}, fallback_bins=FALLBACK)``;
* ``hashing``: ``Hashing(CAPACITY + FALLBACK)`` + ``Embedding`` (the same rows);
* ``unbounded``: ``DynamicEmbedding`` whose capacity holds every id of the run.

Printed: each model's mean test-then-train AUC over the micro-batches after
the first (each micro-batch scored with the model from before it), the
dynamic table's rows at every micro-batch's end (its checkpoint) against
its capacity, its fallback reads, refused admissions and evictions. Then
steps/s of ``optimize`` on 2 workers (rank 0's step seconds, launch and
warm-up aside): the dynamic table (replicated, one all-gather of the batch's
ids a step) against a fixed ``Embedding`` holding every id's row, sharded
over the workers, one file a run, the median of rounds.

The last line is ``RESULT dynamic_minus_hashing_auc=<AUC points>``.

Run ``flock /tmp/sparktf-bench.lock python benchmarks/bench_dynamic.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from typing import Any, Dict, List

import numpy as np

from bench_train import SESSION_CONF  # beside this script

CAPACITY, FALLBACK, DIM, TTL = 2000, 256, 8, 40
STEP_LAPS = ("data", "lookup", "compute", "exchange", "apply")
#: How far the popular ids move each file: the top ranks stay for several files, the tail brings new ids.
DRIFT = 20
SCHEMA = "id long, label int"


def id_bias(ids: np.ndarray) -> np.ndarray:
    """The hidden click logit of each id: a hash of the id, in [-3, 3)."""
    mixed = (ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return (mixed % np.uint64(1000)).astype(np.float32) / 1000 * 6 - 3


def write_file(folder: str, index: int, records: int, drift: int, seed: int) -> np.ndarray:
    """File ``index`` of the stream: ``records`` events; its ids."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed + index)
    ids = (index * drift + rng.zipf(1.1, size=records) % (20 * CAPACITY)).astype(np.int64)
    labels = (rng.random(records) < 1 / (1 + np.exp(-id_bias(ids)))).astype(np.int32)
    hidden = os.path.join(folder, f".{index:04d}.tmp")
    pq.write_table(pa.table({"id": pa.array(ids), "label": pa.array(labels)}), hidden)
    os.rename(hidden, os.path.join(folder, f"{index:04d}.parquet"))
    return ids


def build_model(kind: str, capacity: int) -> Any:
    import keras

    from sparktf.layers import DynamicEmbedding

    keras.utils.set_random_seed(0)
    ids = keras.Input((), dtype="int64", name="id")
    if kind == "hashing":
        vectors = keras.layers.Embedding(capacity + FALLBACK, DIM, name="table")(
            keras.layers.Hashing(capacity + FALLBACK)(ids))
    elif kind == "fixed":
        vectors = keras.layers.Embedding(capacity, DIM, name="table")(ids)
    else:
        vectors = DynamicEmbedding(DIM, capacity, admit_after=2, evict={"ttl_steps": TTL}, fallback_bins=FALLBACK,
                                   name="table")(ids)
    model = keras.Model(ids, keras.layers.Dense(1, activation="sigmoid")(vectors))
    model.compile(keras.optimizers.Adam(0.02), "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    return model


def stream_run(spark: Any, folder: str, work: str, kind: str, capacity: int, batch: int) -> List[Dict[str, Any]]:
    """One model trained on the whole stream; its progress entries."""
    from sparktf import TFDataset, TFOptimizer

    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(folder)
    dataset = TFDataset.from_dataframe(stream, "id", "label", batch_size=batch, shuffle=False)
    optimizer = TFOptimizer.from_keras(build_model(kind, capacity), dataset, model_dir=os.path.join(work, kind),
                                       num_workers=1)
    query = optimizer.optimize_stream(trigger={"availableNow": True})
    query.awaitTermination(3600)
    if query.exception() is not None:
        raise query.exception()
    return query.training_progress


def steps_per_second(spark: Any, path: str, kind: str, capacity: int, batch: int, rounds: int) -> float:
    """Median steps/s of ``optimize`` over one file on 2 workers (the fixed table sharded over them), from the
    seconds rank 0's steps took (its laps: the batch, the lookup, compute, exchange and update)."""
    from sparktf import MaxEpoch, TFDataset, TFOptimizer

    rates = []
    for _ in range(rounds):
        model = build_model(kind, capacity)
        dataset = TFDataset.from_dataframe(spark.read.parquet(path), "id", "label", batch_size=batch)
        sharded = ["table"] if kind == "fixed" else None
        optimizer = TFOptimizer.from_keras(model, dataset, num_workers=2, sharded_tables=sharded)
        optimizer.optimize(MaxEpoch(1), verbose=0)  # one segment: rank 0's step phases, launch and warm-up aside
        stepping = sum(optimizer.last_timings.get(phase, 0.0) for phase in STEP_LAPS)
        rates.append(optimizer.iteration / stepping)
    return float(np.median(rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer and smaller files")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import sparktf

    files, records, batch, drift = (6, 6000, 256, DRIFT) if args.quick else (12, 20000, 512, DRIFT)
    spark = sparktf.init_spark("local[2]", app_name="bench_dynamic",
                               conf={**SESSION_CONF, "spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    work = tempfile.mkdtemp(prefix="sparktf-bench-dynamic-")
    folder = os.path.join(work, "events")
    os.makedirs(folder)
    try:
        ids = np.concatenate([write_file(folder, index, records, drift, 11) for index in range(files)])
        distinct = int(np.unique(ids).size)
        results: Dict[str, float] = {"distinct_ids_over_capacity": distinct / CAPACITY}
        progress = {}
        for kind, capacity in (("dynamic", CAPACITY), ("hashing", CAPACITY), ("unbounded", distinct)):
            progress[kind] = stream_run(spark, folder, work, kind, capacity, batch)
            results[f"{kind}_auc"] = float(np.mean([entry["test_auc"] for entry in progress[kind][1:]]))
        tables = [entry["dynamic_tables"]["table"] for entry in progress["dynamic"]]
        for entry, stats in zip(progress["dynamic"], tables):
            print(f"micro-batch {entry['batchId']:2d}: rows {stats['rows']:5d} of {CAPACITY}, fallback reads "
                  f"{stats['fallback_reads']:7d}, refused {stats['refused_full']:6d}, evicted {stats['evicted']:6d}, "
                  f"test AUC dynamic {entry['test_auc']:.3f}")
        results["max_rows_over_capacity"] = max(stats["rows"] for stats in tables) / CAPACITY
        results["fallback_reads"] = float(tables[-1]["fallback_reads"])
        results["dynamic_minus_hashing_auc"] = 100 * (results["dynamic_auc"] - results["hashing_auc"])
        results["unbounded_minus_dynamic_auc"] = 100 * (results["unbounded_auc"] - results["dynamic_auc"])
        path = os.path.join(folder, f"{files - 1:04d}.parquet")
        rounds = 1 if args.quick else 3
        steps_per_second(spark, path, "dynamic", CAPACITY, batch, 1)  # warm: workers, TensorFlow
        fixed = steps_per_second(spark, path, "fixed", 20 * CAPACITY + files * drift, batch, rounds)
        dynamic = steps_per_second(spark, path, "dynamic", CAPACITY, batch, rounds)
        results.update(fixed_sharded_steps_per_s=fixed, dynamic_steps_per_s=dynamic,
                       dynamic_over_sharded_steps=dynamic / fixed)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for key, value in results.items():
        print(f"{key:30s} {value:12.3f}")
    for key in ("max_rows_over_capacity", "unbounded_minus_dynamic_auc", "dynamic_over_sharded_steps",
                "dynamic_minus_hashing_auc"):
        print(f"RESULT {key}={results[key]:.3f}")


if __name__ == "__main__":
    main()
