"""Streaming benchmark: training and scoring a file stream against the batch paths, and how fresh the model is.

One ``local[2]`` session, one MLP (``WIDTH`` floats -> 64 -> 1, Adam), events
as parquet files of ``RECORDS`` rows written with pyarrow and renamed into the
stream's folder (so a file is whole when Spark lists it). Every path is run
once on a small input first (Python workers, TensorFlow, the traced step).

* ``stream_train_ratio``: records/s of ``optimize_stream`` over ``FILES``
  files (``availableNow``, one file a micro-batch: each tested, trained in
  one pass, checkpointed) against ``optimize(MaxEpoch(1))`` over the same
  files read as one DataFrame.
* ``event_to_trained_p95_s``: a ``processingTime`` 2 s query while a file
  lands every 2 s; per file, from its rename into the folder to the end of
  the micro-batch that trained it (checkpoint and publish included).
* ``trained_to_visible_p95_s``: beside it, a scoring query
  (``TFPredictor.from_published`` on a ``rate`` stream of one fixed probe
  record, a 0.5 s trigger) records each micro-batch's prediction of the
  probe; each version's own prediction of the probe tells which version
  scored it. Per version, from the end of the micro-batch that published it
  to the first scoring micro-batch using it.
* ``stream_score_ratio``: records/s of ``predict_dataframe`` on the file
  stream (``availableNow``, ``noop`` sink) against the batch DataFrame of the
  same files (``noop`` sink).

The last line is ``RESULT stream_train_ratio=<stream / batch>``.

Run ``flock /tmp/sparktf-bench.lock python benchmarks/bench_stream.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
from typing import Any, Dict, List

import numpy as np

WIDTH = 32
SESSION_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "2",
}
SCHEMA = "features array<float>, label int"


def write_file(folder: str, name: str, records: int, seed: int) -> float:
    """A parquet file of ``records`` events, renamed into ``folder``; the time it appeared there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(records, WIDTH)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(np.int32)
    table = pa.table({"features": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), WIDTH).cast(
        pa.list_(pa.float32())), "label": pa.array(y)})
    hidden = os.path.join(folder, f".{name}.tmp")
    pq.write_table(table, hidden)
    os.rename(hidden, os.path.join(folder, f"{name}.parquet"))
    return time.time()


def build_model(seed: int = 0) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(keras.optimizers.Adam(1e-3), "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    return model


def stream_of(spark: Any, folder: str) -> Any:
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(folder)


def train_rates(spark: Any, work: str, files: int, records: int, batch: int) -> Dict[str, float]:
    """records/s of optimize_stream and of optimize over the same files."""
    from sparktf import MaxEpoch, TFDataset, TFOptimizer

    folder = os.path.join(work, "events")
    os.makedirs(folder)
    for index in range(files):
        write_file(folder, f"events-{index:03d}", records, index)
    warm = os.path.join(work, "warm")
    os.makedirs(warm)
    write_file(warm, "warm-000", batch * 2, 99)
    # warm-up: both paths once, on a small input
    TFOptimizer.from_keras(build_model(), TFDataset.from_dataframe(spark.read.parquet(warm), "features", "label",
                                                                   batch_size=batch)).optimize(MaxEpoch(1), verbose=0)
    warm_query = TFOptimizer.from_keras(
        build_model(), TFDataset.from_dataframe(stream_of(spark, warm), "features", "label", batch_size=batch),
        model_dir=os.path.join(work, "warm-model")).optimize_stream(trigger={"availableNow": True})
    warm_query.awaitTermination()

    frame = spark.read.parquet(folder)
    started = time.perf_counter()
    TFOptimizer.from_keras(build_model(), TFDataset.from_dataframe(frame, "features", "label", batch_size=batch)
                           ).optimize(MaxEpoch(1), verbose=0)
    batch_seconds = time.perf_counter() - started

    dataset = TFDataset.from_dataframe(stream_of(spark, folder), "features", "label", batch_size=batch)
    optimizer = TFOptimizer.from_keras(build_model(), dataset, model_dir=os.path.join(work, "model"))
    started = time.perf_counter()
    query = optimizer.optimize_stream(trigger={"availableNow": True})
    query.awaitTermination()
    stream_seconds = time.perf_counter() - started
    assert query.exception() is None, query.exception()
    total = files * records
    per_batch = np.median([entry["seconds"] for entry in query.training_progress])
    return {"batch_records_per_s": total / batch_seconds, "stream_records_per_s": total / stream_seconds,
            "micro_batch_median_s": float(per_batch), "stream_train_ratio": batch_seconds / stream_seconds}


def freshness(spark: Any, work: str, files: int, records: int, batch: int) -> Dict[str, float]:
    """p95 seconds from a file's arrival to its micro-batch's end, and from there to a scorer using its version."""
    from pyspark.sql import functions as F

    from sparktf import TFDataset, TFOptimizer, TFPredictor
    from sparktf.models.published import PublishedVersion, load_version, newest_version, published_root, versions

    folder, model_dir = os.path.join(work, "live"), os.path.join(work, "live-model")
    os.makedirs(folder)
    arrivals = [write_file(folder, "live-000", records, 1000)]
    dataset = TFDataset.from_dataframe(stream_of(spark, folder), "features", "label", batch_size=batch)
    optimizer = TFOptimizer.from_keras(build_model(), dataset, model_dir=model_dir, keep_checkpoints=None)
    training = optimizer.optimize_stream(trigger={"processingTime": "2 seconds"}, publish_every=1)
    deadline = time.time() + 120
    while newest_version(model_dir) is None:  # the scorer needs a first version
        if time.time() > deadline or training.exception() is not None:
            raise RuntimeError(f"no version published: {training.exception()}")
        time.sleep(0.1)
    probe = [0.1 * (i % 7) - 0.3 for i in range(WIDTH)]
    rate = (spark.readStream.format("rate").option("rowsPerSecond", 5).load()
            .select(F.array(*[F.lit(v).cast("float") for v in probe]).alias("features")))
    scorer = TFPredictor.from_published(model_dir, TFDataset.from_dataframe(rate, "features", batch_per_thread=64))
    seen: List[tuple] = []

    def record(frame: Any, batch_id: int) -> None:
        row = frame.select("prediction").limit(1).collect()
        if row:
            seen.append((time.time(), float(row[0].prediction[0])))

    scoring = (scorer.predict_dataframe(rate, "features").writeStream.foreachBatch(record)
               .trigger(processingTime="0.5 seconds").option("checkpointLocation", os.path.join(work, "scorer"))
               .start())
    for index in range(1, files):
        time.sleep(max(0.0, arrivals[-1] + 2.0 - time.time()))
        arrivals.append(write_file(folder, f"live-{index:03d}", records, 1000 + index))
    deadline = time.time() + 120
    while len(training.training_progress) < files and time.time() < deadline and training.exception() is None:
        time.sleep(0.2)
    time.sleep(3)  # the scorer's next micro-batches take the last version
    training.stop()
    scoring.stop()
    progress = training.training_progress
    to_trained = [entry["ended"] - arrivals[entry["batchId"]] for entry in progress if entry["batchId"] < files]
    probes = {}  # each version's own prediction of the probe
    for number in versions(model_dir):
        version = PublishedVersion(number, os.path.join(published_root(model_dir), str(number)), {})
        probes[number] = float(load_version(version).predict(np.array([probe], np.float32), verbose=0)[0, 0])
    ended = {entry.get("version"): entry["ended"] for entry in progress if entry.get("version")}
    to_visible = []
    for number, prediction in probes.items():
        if number not in ended:
            continue
        used = [t for t, p in seen if abs(p - prediction) < 1e-6 and t >= ended[number] - 1.0]
        if used:
            to_visible.append(max(0.0, used[0] - ended[number]))
    return {"event_to_trained_p95_s": float(np.percentile(to_trained, 95)),
            "trained_to_visible_p95_s": float(np.percentile(to_visible, 95)) if to_visible else float("nan"),
            "versions_seen_by_scorer": float(len(to_visible))}


def score_rates(spark: Any, work: str, batch: int) -> Dict[str, float]:
    """records/s of predict_dataframe on the stream of the training files and on the same files as a DataFrame."""
    from sparktf import TFDataset, TFPredictor

    folder = os.path.join(work, "events")
    total = spark.read.parquet(folder).count()
    model = build_model()
    predictor = TFPredictor.from_keras(model, TFDataset.from_dataframe(spark.read.parquet(folder), "features",
                                                                       batch_per_thread=batch))
    rates = {}
    for round_ in range(2):  # the first round warms both
        started = time.perf_counter()
        predictor.predict_dataframe(spark.read.parquet(folder), "features").write.format("noop").mode(
            "overwrite").save()
        batch_seconds = time.perf_counter() - started
        stream = spark.readStream.schema(SCHEMA).parquet(folder)
        started = time.perf_counter()
        query = (predictor.predict_dataframe(stream, "features").writeStream.format("noop")
                 .option("checkpointLocation", os.path.join(work, f"score-{round_}"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        stream_seconds = time.perf_counter() - started
        rates = {"score_batch_records_per_s": total / batch_seconds, "score_stream_records_per_s": total / stream_seconds,
                 "stream_score_ratio": batch_seconds / stream_seconds}
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer and smaller files")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import sparktf

    files, records, batch = (4, 4000, 256) if args.quick else (8, 40000, 512)
    spark = sparktf.init_spark("local[2]", app_name="bench_stream", conf=SESSION_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    work = tempfile.mkdtemp(prefix="sparktf-bench-stream-")
    try:
        results = train_rates(spark, work, files, records, batch)
        results.update(score_rates(spark, work, batch))
        results.update(freshness(spark, work, files, max(1000, records // 8), batch))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for key, value in results.items():
        print(f"{key:28s} {value:12.3f}")
    for key in ("stream_score_ratio", "event_to_trained_p95_s", "trained_to_visible_p95_s", "stream_train_ratio"):
        print(f"RESULT {key}={results[key]:.3f}")


if __name__ == "__main__":
    main()
