"""Online click-through prediction from a file stream: train continuously, publish versions, score the stream.

Everything happens in Spark; nothing is downloaded:

1. writes click events to a folder, one parquet file per period. Each event
   has 8 features, a user id and an item id, and whether it is clicked
   follows a rule that *drifts*: its weights turn a little every period, as
   tastes do, and the popular users and items change (Zipf-distributed ids
   whose popular set moves: most ids of a late period were never seen
   before), each id adding a bias of its own;
2. trains a model once on the first periods (``TFOptimizer.optimize``): the
   model a batch pipeline would ship. Its user and item ids go through
   ``sparktf.layers.DynamicEmbedding`` tables: an id gets a row of its own
   at its second sighting, the rows of ids not seen for a while are freed for
   new ones, and the rest read a few shared fallback rows;
3. trains another from the stream (``TFOptimizer.optimize_stream``, one
   file a micro-batch) in one training job that stays up for the whole
   query, on one worker fewer than the session's task slots (the slot left
   over reads and stages the stream): each micro-batch is scored before the
   model learns from it (test-then-train AUC, printed per micro-batch), and
   every micro-batch publishes a version to ``model_dir/published``;
4. scores the stream in a second query with ``TFPredictor.from_published``
   (each micro-batch with the newest version);
5. compares, on the later periods, the online model's test-then-train AUC
   with the AUC of the model trained once.

    spark-submit examples/streaming_ctr.py --periods 12 --events 20000 --model_dir /tmp/ctr
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Dict, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sparktf  # noqa: F401 - before TensorFlow: keeps its start-up log lines out of the output

import keras
import numpy as np
from pyspark.sql import SparkSession

from example_support import example_parser, start_spark
from sparktf import MaxEpoch, TFDataset, TFOptimizer, TFPredictor
from sparktf.layers import DynamicEmbedding
from sparktf.layers.dynamic_embedding import table_stats

FEATURES = 8
#: How far the click rule's weights turn each period (radians, in the plane of the first two features).
DRIFT = 0.35
#: How far the popular ids move each period (their Zipf ranks start there).
ID_DRIFT = 400
SCHEMA = "features array<float>, user long, item long, click int"
INPUTS = ["features", "user", "item"]


def id_bias(ids: np.ndarray, salt: int) -> np.ndarray:
    """The hidden click bias of each id: a hash of the id, in [-1.5, 1.5)."""
    mixed = (ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15 + salt)) >> np.uint64(40)
    return (mixed % np.uint64(1000)).astype(np.float32) / 1000 * 3 - 1.5


def write_period(spark: SparkSession, folder: str, period: int, events: int, seed: int) -> None:
    """Period ``period``'s events as one parquet file: clicks follow the rule of that period."""
    rng = np.random.default_rng(seed + period)
    x = rng.normal(size=(events, FEATURES)).astype(np.float32)
    users = period * ID_DRIFT + rng.zipf(1.1, size=events) % 5000
    items = 10 ** 9 + period * ID_DRIFT + rng.zipf(1.1, size=events) % 5000
    angle = DRIFT * period
    weights = np.array([2 * np.cos(angle), 2 * np.sin(angle), 1.0, -1.0, 0.5, 0, 0, 0], np.float32)
    logits = x @ weights - 1.0 + id_bias(users, 1) + id_bias(items, 2)
    clicks = (rng.random(events) < 1 / (1 + np.exp(-logits))).astype(np.int32)
    rows = [([float(v) for v in row], int(u), int(i), int(c)) for row, u, i, c in zip(x, users, items, clicks)]
    spark.createDataFrame(rows, SCHEMA).coalesce(1).write.mode("overwrite").parquet(
        os.path.join(folder, f"period-{period:04d}"))


def click_model(seed: int, capacity: int) -> Any:
    """Features through a dense layer, user and item ids through dynamic tables of ``capacity`` rows each."""
    keras.utils.set_random_seed(seed)
    features = keras.Input((FEATURES,), name="features")
    users = keras.Input((), dtype="int64", name="user")
    items = keras.Input((), dtype="int64", name="item")
    tables = [DynamicEmbedding(4, capacity, admit_after=2, evict={"ttl_steps": 200}, fallback_bins=64, name=name)
              for name in ("users", "items")]
    joined = keras.layers.Concatenate()([keras.layers.Dense(16, activation="relu")(features),
                                         tables[0](users), tables[1](items)])
    model = keras.Model([features, users, items], keras.layers.Dense(1, activation="sigmoid")(joined))
    model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    return model


def stream_of(spark: SparkSession, folder: str) -> Any:
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(os.path.join(folder, "period-*"))


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = example_parser(__doc__.splitlines()[0])
    parser.add_argument("--periods", type=int, default=12, help="event files (micro-batches)")
    parser.add_argument("--events", type=int, default=20000, help="events per period")
    parser.add_argument("--warm_periods", type=int, default=2, help="periods the once-trained model learns from")
    parser.add_argument("--batch_size", type=int, default=512, help="global batch")
    parser.add_argument("--capacity", type=int, default=4096, help="rows of each dynamic id table")
    parser.add_argument("--model_dir", default=None, help="checkpoints and published versions (default: a temp dir)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.smoke:
        args.periods, args.events, args.batch_size = 5, 600, 128
    spark = start_spark(args, "sparktf streaming CTR")
    work = tempfile.mkdtemp(prefix="sparktf-ctr-")
    model_dir = args.model_dir or os.path.join(work, "model")
    events = os.path.join(work, "events")
    try:
        for period in range(args.periods):
            write_period(spark, events, period, args.events, args.seed)

        # the model a batch pipeline ships: trained once on the first periods
        first = spark.read.parquet(*[os.path.join(events, f"period-{p:04d}") for p in range(args.warm_periods)])
        static = click_model(args.seed, args.capacity)
        TFOptimizer.from_keras(static, TFDataset.from_dataframe(first, INPUTS, "click", batch_size=args.batch_size),
                               num_workers=args.num_workers).optimize(MaxEpoch(3), verbose=0)

        # the online model: every micro-batch tested, then trained on, then published, by one resident job that
        # leaves a task slot for the stream's own jobs
        online = click_model(args.seed, args.capacity)
        dataset = TFDataset.from_dataframe(stream_of(spark, events), INPUTS, "click", batch_size=args.batch_size)
        online_workers = max(1, min(args.num_workers, spark.sparkContext.defaultParallelism - 1))
        optimizer = TFOptimizer.from_keras(online, dataset, model_dir=model_dir, num_workers=online_workers)
        report = keras.callbacks.LambdaCallback(on_epoch_end=lambda batch_id, logs: print(
            f"micro-batch {batch_id}: {logs['records']} events, test-then-train AUC {logs['test_auc']:.3f}, "
            f"loss {logs['loss']:.4f}; {_rows(online)}", flush=True))
        query = optimizer.optimize_stream(trigger={"availableNow": True}, publish_every=1, callbacks=[report])
        query.awaitTermination()
        progress = query.training_progress

        # a scoring query with the newest published version
        scorer = TFPredictor.from_published(model_dir, TFDataset.from_dataframe(
            stream_of(spark, events), INPUTS, batch_per_thread=args.batch_size))
        scoring = (scorer.predict_dataframe(stream_of(spark, events), INPUTS, "click_probability").writeStream
                   .format("memory").queryName("ctr_scores").trigger(availableNow=True).start())
        scoring.awaitTermination()
        scored = spark.sql("select count(*) from ctr_scores").first()[0]

        later = [entry for entry in progress if entry["batchId"] >= args.warm_periods]
        static_aucs = [_static_auc(spark, static, events, entry["batchId"], args) for entry in later]
        online_auc = float(np.mean([entry["test_auc"] for entry in later]))
        static_auc = float(np.mean(static_aucs))
        print(f"later periods: online model (test-then-train) AUC {online_auc:.3f}, "
              f"model trained once AUC {static_auc:.3f}; {len(progress)} micro-batches trained, "
              f"{scored} events scored with published version {progress[-1].get('version')}")
        return {"progress": progress, "online_auc": online_auc, "static_auc": static_auc, "scored": scored}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _static_auc(spark: SparkSession, model: Any, events: str, period: int, args: Any) -> float:
    frame = spark.read.parquet(os.path.join(events, f"period-{period:04d}"))
    dataset = TFDataset.from_dataframe(frame, INPUTS, "click", batch_per_thread=args.batch_size)
    return float(TFOptimizer.from_keras(model, dataset, num_workers=args.num_workers).evaluate()["auc"])


def _rows(model: Any) -> str:
    """What the model's dynamic id tables hold, as the driver has them (the micro-batch before's state)."""
    return ", ".join(f"{name} {stats['rows']} rows ({stats['fallback_reads']} fallback reads, {stats['evicted']} "
                     f"evicted)" for name, stats in table_stats(model).items())


if __name__ == "__main__":
    main()
