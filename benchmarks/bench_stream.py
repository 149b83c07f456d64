"""Streaming benchmark: training and scoring a file stream against the batch paths, and how fresh the model is.

One ``local[4]`` session on the machine's 2 cores (two training workers, a
slot for the stream's own jobs and one for a scorer), one MLP (``WIDTH``
floats -> 64 -> 1, Adam), events as parquet files of ``RECORDS`` rows written
with pyarrow and renamed into the stream's folder (so a file is whole when
Spark lists it). Every path is run once on a small input first (Python
workers, TensorFlow, the traced step). Training runs on 2 workers on every
path.

* ``stream_train_ratio``: records/s of ``optimize_stream`` with its resident
  training job over ``FILES`` files (``availableNow``, one file a
  micro-batch: each staged, tested and trained in one pass, checkpointed)
  against ``optimize(MaxEpoch(1))`` over the same files read as one
  DataFrame; ``stream_jobs_train_ratio`` the same with ``resident=False``
  (a count, a test and a training job per micro-batch), measured in the
  same run; ``first_micro_batch_ratio`` the resident run's first
  micro-batch's seconds (staged to trained) over the median of the others.
* ``event_to_trained_p95_s``: a ``processingTime`` 1 s query while a file
  lands every second; per file, from its rename into the folder to the end
  of the micro-batch that trained it (checkpoint and publish included).
* ``trained_to_visible_p95_s``: beside it, a scoring query
  (``TFPredictor.from_published`` on a ``rate`` stream of one fixed probe
  record, a 0.5 s trigger) records each micro-batch's prediction of the
  probe; each version's own prediction of the probe tells which version
  scored it. Per version, from the end of the micro-batch that published it
  to the first scoring micro-batch using it.
* ``stream_score_ratio``: records/s of ``predict_dataframe`` on the file
  stream (``availableNow``, ``noop`` sink) against the batch DataFrame of the
  same files (``noop`` sink).
* ``delta_bytes_ratio``: the bytes of a delta version of an NCF-shaped model
  (user and item tables of ``USERS`` and ``ITEMS`` rows of 32, an MLP) after
  an update touching 1 % of each table's rows, over a full version's.

The last line is ``RESULT stream_train_ratio=<resident stream / batch>``.

Run ``flock /tmp/sparktf-bench.lock python benchmarks/bench_stream.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any, Dict, Tuple

import numpy as np

from bench_train import SESSION_CONF  # beside this script

WIDTH = 32
SCHEMA = "features array<float>, label int"
WORKERS = 2
USERS, ITEMS = 200_000, 20_000


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
    # named: every model built here has the same architecture key, so the warm-up warms the measured runs' workers
    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(64, activation="relu", name="hidden"),
                              keras.layers.Dense(1, activation="sigmoid", name="click")], name="bench_stream_mlp")
    model.compile(keras.optimizers.Adam(1e-3), "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    return model


def stream_of(spark: Any, folder: str) -> Any:
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(folder)


def train_rates(spark: Any, work: str, files: int, records: int, batch: int) -> Dict[str, float]:
    """records/s of optimize_stream (resident, and a job per micro-batch) and of optimize over the same files."""
    from sparktf import MaxEpoch, TFDataset, TFOptimizer

    folder = os.path.join(work, "events")
    os.makedirs(folder)
    for index in range(files):
        write_file(folder, f"events-{index:03d}", records, index)
    warm = os.path.join(work, "warm")
    os.makedirs(warm)
    write_file(warm, "warm-000", batch * 2, 99)
    # warm-up: every path once, on a small input
    TFOptimizer.from_keras(build_model(), TFDataset.from_dataframe(spark.read.parquet(warm), "features", "label",
                                                                   batch_size=batch), num_workers=WORKERS
                           ).optimize(MaxEpoch(1), verbose=0)
    for resident in (True, False):
        stream_seconds_of(spark, warm, os.path.join(work, f"warm-model-{resident}"), batch, resident)

    frame = spark.read.parquet(folder)
    started = time.perf_counter()
    TFOptimizer.from_keras(build_model(), TFDataset.from_dataframe(frame, "features", "label", batch_size=batch),
                           num_workers=WORKERS).optimize(MaxEpoch(1), verbose=0)
    batch_seconds = time.perf_counter() - started
    jobs_seconds, _ = stream_seconds_of(spark, folder, os.path.join(work, "model-jobs"), batch, False)
    stream_seconds, progress = stream_seconds_of(spark, folder, os.path.join(work, "model"), batch, True)
    total = files * records
    per_batch = [entry["seconds"] for entry in progress]
    parts = {key: float(np.median([entry[key] for entry in progress]))
             for key in ("staging_seconds", "train_seconds", "checkpoint_seconds", "backpressure_seconds")}
    return {"batch_records_per_s": total / batch_seconds, "stream_records_per_s": total / stream_seconds,
            "micro_batch_median_s": float(np.median(per_batch)), "micro_batch_first_s": per_batch[0],
            "first_micro_batch_ratio": per_batch[0] / float(np.median(per_batch[1:])),
            **{f"median_{key}": value for key, value in parts.items()},
            "stream_jobs_train_ratio": batch_seconds / jobs_seconds,
            "stream_train_ratio": batch_seconds / stream_seconds}


def stream_seconds_of(spark: Any, folder: str, model_dir: str, batch: int, resident: bool) -> Tuple[float, list]:
    """Seconds of one ``optimize_stream`` over ``folder``'s files, and its training progress."""
    from sparktf import TFDataset, TFOptimizer

    dataset = TFDataset.from_dataframe(stream_of(spark, folder), "features", "label", batch_size=batch)
    optimizer = TFOptimizer.from_keras(build_model(), dataset, model_dir=model_dir, num_workers=WORKERS)
    started = time.perf_counter()
    query = optimizer.optimize_stream(trigger={"availableNow": True}, resident=resident)
    query.awaitTermination()
    seconds = time.perf_counter() - started
    assert query.exception() is None, query.exception()
    return seconds, query.training_progress


def delta_bytes() -> Dict[str, float]:
    """Bytes of a delta version after 1 % of the NCF-shaped model's table rows changed, against a full version."""
    import keras

    from sparktf.models.published import VersionWriter, table_indices

    keras.utils.set_random_seed(0)
    user, item = keras.Input((), dtype="int32"), keras.Input((), dtype="int32")
    joined = keras.layers.Concatenate()([keras.layers.Embedding(USERS, 32)(user), keras.layers.Embedding(ITEMS, 32)(item)])
    hidden = keras.layers.Dense(64, activation="relu")(joined)
    model = keras.Model([user, item], keras.layers.Dense(1, activation="sigmoid")(hidden))
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="sparktf-bench-delta-") as model_dir:
        writer = VersionWriter(model_dir, full_every=10)
        full = writer.write(model, {})
        weights = model.get_weights()
        for index, weight in enumerate(weights):  # one update: 1 % of each table's rows, every dense weight
            rows = rng.choice(len(weight), len(weight) // 100, replace=False) if index in table_indices(model) else slice(None)
            weight[rows] += 0.01
        model.set_weights(weights)
        delta = writer.write(model, {})
        full_bytes, delta_bytes_ = (os.path.getsize(version.files[0]) for version in (full, delta))
    return {"full_version_mb": full_bytes / 1e6, "delta_version_mb": delta_bytes_ / 1e6,
            "delta_bytes_ratio": delta_bytes_ / full_bytes}


def freshness(spark: Any, work: str, files: int, records: int, batch: int) -> Dict[str, float]:
    """p95 seconds from a file's arrival to its micro-batch's end, and from there to a scorer using its version.

    Both queries run all along (the training job on two slots, the staging and the scorer on one each); what is
    measured starts once both have warmed up (the first
    version published, the scorer's first rows written).
    """
    from pyspark.sql import functions as F

    from sparktf import TFDataset, TFOptimizer, TFPredictor
    from sparktf.models.published import PublishedVersion, load_version, newest_version, published_root, versions

    folder, model_dir = os.path.join(work, "live"), os.path.join(work, "live-model")
    os.makedirs(folder)
    write_file(folder, "live-000", records, 1000)
    dataset = TFDataset.from_dataframe(stream_of(spark, folder), "features", "label", batch_size=batch)
    # the resident job's two slots, one for staging, one for the scorer: local[4]'s
    optimizer = TFOptimizer.from_keras(build_model(), dataset, model_dir=model_dir, keep_checkpoints=None,
                                       num_workers=WORKERS)
    training = optimizer.optimize_stream(trigger={"processingTime": "1 second"}, publish_every=1)
    wait_until(lambda: newest_version(model_dir) is not None, training, "the first version")
    probe = [0.1 * (i % 7) - 0.3 for i in range(WIDTH)]
    rate = (spark.readStream.format("rate").option("rowsPerSecond", 5).option("numPartitions", 1).load()
            .select(F.array(*[F.lit(v).cast("float") for v in probe]).alias("features")))
    scorer = TFPredictor.from_published(model_dir, TFDataset.from_dataframe(rate, "features", batch_per_thread=64))
    clock = F.udf(lambda _: time.time(), "double")  # when the task scored the row: right after the model ran
    scored = scorer.predict_dataframe(rate, "features").select(clock(F.col("prediction")).alias("scored_at"),
                                                               F.col("prediction")[0].alias("p"))
    scoring = (scored.writeStream.format("memory").queryName("bench_scores").trigger(processingTime="0.5 seconds")
               .option("checkpointLocation", os.path.join(work, "scorer")).start())
    wait_until(lambda: spark.sql("select count(*) from bench_scores").first()[0] > 0, scoring, "the scorer's rows")
    arrivals = {}
    first = len(training.training_progress)  # the micro-batch of the next file
    for index in range(files):
        time.sleep(max(0.0, max(arrivals.values(), default=0.0) + 1.0 - time.time()))
        arrivals[first + index] = write_file(folder, f"live-{index + 1:03d}", records, 1001 + index)
    wait_until(lambda: len(training.training_progress) >= first + files, training, "the last micro-batch")
    time.sleep(3)  # the scorer's next micro-batches take the last version
    training.stop()
    scoring.stop()
    seen = sorted((row.scored_at, row.p) for row in spark.sql("select * from bench_scores").collect())
    trained = [entry for entry in training.training_progress if entry["batchId"] in arrivals]
    to_trained = [entry["ended"] - arrivals[entry["batchId"]] for entry in trained]
    to_visible = []
    for entry in trained:  # each version's own prediction of the probe tells which rows it scored
        version = PublishedVersion(entry["version"], os.path.join(published_root(model_dir), str(entry["version"])), {})
        prediction = float(load_version(version).predict(np.array([probe], np.float32), verbose=0)[0, 0])
        used = [t for t, p in seen if abs(p - prediction) < 1e-6]
        if used:
            to_visible.append(max(0.0, used[0] - entry["ended"]))
    return {"event_to_trained_p95_s": float(np.percentile(to_trained, 95)),
            "event_to_trained_median_s": float(np.median(to_trained)),
            "trained_to_visible_p95_s": float(np.percentile(to_visible, 95)) if to_visible else float("nan"),
            "versions_seen_by_scorer": float(len(to_visible)), "versions_published": float(len(versions(model_dir)))}


def wait_until(condition: Any, query: Any, what: str, timeout: float = 180.0) -> None:
    """Poll ``condition`` (the benchmark watches two running queries) until it holds; fail on the query's error."""
    deadline = time.time() + timeout
    while not condition():
        if query.exception() is not None or time.time() > deadline:
            raise RuntimeError(f"no {what} within {timeout:.0f} s: {query.exception()}")
        time.sleep(0.1)


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
    spark = sparktf.init_spark("local[4]", app_name="bench_stream",
                               conf={**SESSION_CONF, "spark.sql.shuffle.partitions": "2"})
    spark.sparkContext.setLogLevel("ERROR")
    work = tempfile.mkdtemp(prefix="sparktf-bench-stream-")
    try:
        results = train_rates(spark, work, files, records, batch)
        results.update(score_rates(spark, work, batch))
        results.update(freshness(spark, work, files, max(1000, records // 8), batch))
        results.update(delta_bytes())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for key, value in results.items():
        print(f"{key:28s} {value:12.3f}")
    for key in ("stream_score_ratio", "event_to_trained_p95_s", "trained_to_visible_p95_s", "first_micro_batch_ratio",
                "delta_bytes_ratio", "stream_jobs_train_ratio", "stream_train_ratio"):
        print(f"RESULT {key}={results[key]:.3f}")


if __name__ == "__main__":
    main()
