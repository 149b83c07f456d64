"""Input benchmark: training on data read every epoch, and on data larger than a worker's memory budget.

Side by side in one run on ``local[2]``:

(a) **JPEG TFRecords** (2,000 records of 96x96 JPEGs in 8 files; ``parse_fn``
    decodes, takes a random 64x64 crop and a random flip; a small CNN, global
    batch 64): sparktf on 2 workers with ``from_tfrecord_file(cache=False)``
    against the same ``tf.data`` pipeline (interleaved files, shuffle buffer,
    ``parse_fn`` mapped with ``AUTOTUNE``, prefetch) feeding the same train
    step in one fresh process on both cores. Images/s over a window of at
    least ``WINDOW_SECONDS`` (20 s) after untimed epochs: whole epochs in
    one ``optimize`` call (its fixed cost included), as many as a warm
    epoch's step time says fill the window; best of 3 interleaved rounds
    (``--quick``: 1). ``RESULT stream_ratio`` = sparktf / one process (goal >= 0.9).
    ``RESULT call_overhead_s``: per timed ``optimize`` call on warm workers,
    its seconds minus rank 0's step time (batches, compute, all-reduce,
    apply): from the call to the first step plus from the last step to the
    return (goal <= 0.3 s); the median over the rounds.
(b) **A dataset larger than trainDataMemory**: 2 GB of ``from_rdd`` records
    (1024 float32 + a label, in 4 partitions; 1 GB per worker) at the default
    ``spark.sparktf.trainDataMemory`` (512m: streamed through the shuffle
    window) against 200 MB (100 MB per worker: in memory); a linear model
    so that the feed shows. Training-batch records/s of a second
    ``optimize`` call (the first pass spilled the shards), each one's peak
    worker ``RssAnon`` over both calls, and the second segment's time to its
    first step (from the task's start: ``threads`` + ``data_cache`` + ... + ``connect`` on rank 0).
    ``RESULT stream_feed_ratio`` = 2 GB records/s / 200 MB records/s (goal >= 0.8).

(c) **The same JPEG TFRecords on S3**: the files of (a) on a local S3 server
    (moto's server mode on 127.0.0.1 in a process of its own, behind a TCP
    proxy, reached through ``AWS_ENDPOINT_URL``; the executors get it from
    ``spark.executorEnv.*``), read by the workers through fsspec, against
    the same files on local disk read by ``TFRecordDataset``; sparktf 2
    workers with ``cache=False`` all, 3 rounds taking the three sides in
    turn: local files, S3 (the proxy passes everything on), and S3 as from a
    cloud VM (the proxy holds each request 20 ms and caps each connection at
    100 MB/s: ``s3_store.py``). ``RESULT s3_stream_ratio`` = the distant S3's
    best images/s / local files' best (goal >= 0.9); ``s3_direct_ratio``
    the same without the latency; ``s3_server_cpu_share`` the median share
    of the 2 cores the S3 server's process took while S3 was read directly.

Run ``python benchmarks/bench_input.py [--quick] [--part a|b|c]`` (``--quick``: 800 JPEGs,
one round of (a)'s 20 s windows, 200 MB at trainDataMemory=32m against 20 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Tuple

import numpy as np

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_feed  # noqa: E402
from worker_memory import PeakSampler, python_workers  # noqa: E402

JPEG_SIZE, CROP, CLASSES, FILES, BATCH = 96, 64, 10, 8, 64
WIDTH, FEED_BATCH = 1024, 512
SPARK_CONF = {**bench_feed.SPARK_CONF, "spark.driver.memory": "6g"}
FIRST_STEP_PHASES = ("threads", "data_cache", "model_load", "warm_up", "state_fetch", "connect")
STEP_PHASES = ("data", "compute", "exchange", "apply")
#: Seconds each timed case of (a) runs at least.
WINDOW_SECONDS = 20.0


# ---------------------------------------------------------------------------------------- (a) JPEG TFRecords


def write_jpeg_records(folder: str, records: int) -> List[str]:
    """``records`` random 96x96 JPEGs with labels in :data:`FILES` TFRecord files; their paths."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    paths = [os.path.join(folder, f"train-{i:02d}.tfrecord") for i in range(FILES)]
    writers = [tf.io.TFRecordWriter(path) for path in paths]
    for index in range(records):
        smooth = rng.integers(0, 256, size=(12, 12, 3), dtype=np.uint8).repeat(8, 0).repeat(8, 1)
        jpeg = tf.io.encode_jpeg(smooth, quality=90).numpy()
        features = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[index % CLASSES]))}
        writers[index % FILES].write(tf.train.Example(features=tf.train.Features(feature=features))
                                     .SerializeToString())
    for writer in writers:
        writer.close()
    return paths


def parse_fn(serialized):
    """Decode, random 64x64 crop, random flip, scale to [0, 1]."""
    import tensorflow as tf

    parsed = tf.io.parse_single_example(serialized, {"image": tf.io.FixedLenFeature([], tf.string),
                                                     "label": tf.io.FixedLenFeature([], tf.int64)})
    image = tf.io.decode_jpeg(parsed["image"], channels=3)
    image = tf.image.random_flip_left_right(tf.image.random_crop(image, [CROP, CROP, 3]))
    return tf.cast(image, tf.float32) / 255.0, tf.cast(parsed["label"], tf.int32)


def small_cnn():
    import keras

    model = keras.Sequential([
        keras.Input((CROP, CROP, 3)),
        keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(CLASSES, activation="softmax"),
    ])
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
    return model


def one_process_images_per_second(paths: List[str], records: int) -> float:
    """The same input pipeline feeding the same train step in this process on all cores (a fresh process),
    timed over whole epochs filling at least ``WINDOW_SECONDS``."""
    import tensorflow as tf

    from bench_train import faster_step

    model = small_cnn()
    model.optimizer.build(model.trainable_variables)
    files = tf.data.Dataset.from_tensor_slices(paths).shuffle(len(paths))
    data = files.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=4)
    data = data.shuffle(2_000).map(parse_fn, num_parallel_calls=tf.data.AUTOTUNE)
    data = data.batch(BATCH, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE)
    steps = records // BATCH
    iterator = iter(data)
    step = faster_step(model, [next(iterator) for _ in range(5)])  # plain or XLA, as sparktf's workers pick
    for _ in range(steps):  # the untimed first epoch, as for sparktf
        step(*next(iterator))
    started, done = time.perf_counter(), 0
    while done == 0 or time.perf_counter() - started < WINDOW_SECONDS:
        for _ in range(steps):
            loss = step(*next(iterator))
        float(loss)
        done += steps
    return done * BATCH / (time.perf_counter() - started)


def sparktf_optimizer(paths: List[str]) -> Tuple[object, int]:
    """A 2-worker TFOptimizer over the JPEG records with ``cache=False``, its first two (untimed) epochs done,
    and the whole epochs whose steps fill ``WINDOW_SECONDS`` at the second epoch's rate."""
    from sparktf import MaxEpoch, TFDataset, TFOptimizer

    dataset = TFDataset.from_tfrecord_file(paths, parse_fn, batch_size=BATCH, cache=False, seed=0)
    optimizer = TFOptimizer.from_keras(small_cnn(), dataset, num_workers=2)
    optimizer.optimize(MaxEpoch(1), verbose=0)  # untimed: tracing, the workers' first pipeline
    optimizer.optimize(MaxEpoch(2), verbose=0)  # untimed, warm: rank 0's step time of one epoch
    epoch_seconds = sum(optimizer.last_timings.get(phase, 0.0) for phase in STEP_PHASES)
    return optimizer, max(1, int(np.ceil(WINDOW_SECONDS / max(epoch_seconds, 1e-3))))


def sparktf_images_per_second(optimizer, epochs: int) -> Tuple[float, float]:
    """Images/s of ``epochs`` more epochs in one ``optimize`` call, and the call's seconds outside rank 0's steps."""
    from sparktf import MaxEpoch

    per_epoch = optimizer.dataset.iterations_per_epoch(2)
    started = time.perf_counter()
    optimizer.optimize(MaxEpoch(optimizer.iteration // per_epoch + epochs), verbose=0)
    seconds = time.perf_counter() - started
    steps = sum(optimizer.last_timings.get(phase, 0.0) for phase in STEP_PHASES)
    return epochs * per_epoch * BATCH / seconds, seconds - steps


def compare_jpeg_pipelines(folder: str, jpegs: int, rounds: int) -> Tuple[float, float, float, int, dict]:
    """Best images/s of the one-process pipeline and of sparktf over interleaved rounds, the median seconds of
    a sparktf call outside its steps, the epochs of sparktf's window, and sparktf's timings."""
    optimizer, epochs = sparktf_optimizer(sorted(os.path.join(folder, name) for name in os.listdir(folder)))
    single = distributed = 0.0
    overheads = []
    for _ in range(rounds):
        single = max(single, json.loads(subprocess.run(
            [sys.executable, __file__, "--single", folder, str(jpegs)],
            check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])["images_per_second"])
        rate, overhead = sparktf_images_per_second(optimizer, epochs)
        distributed = max(distributed, rate)
        overheads.append(overhead)
    return single, distributed, float(np.median(overheads)), epochs, optimizer.last_timings


def compare_storage(folder: str, epochs: int, rounds: int) -> Dict[str, List[dict]]:
    """sparktf ``cache=False`` over the files on local disk, on a local S3 server, and on that server behind the
    latency proxy, the three in turn each round: per side, each round's images/s and, for S3, the seconds of
    CPU the server's process and the proxy's thread spent in it."""
    import fsspec

    import sparktf
    from s3_store import LocalS3

    with LocalS3() as store:
        credentials = {"AWS_ENDPOINT_URL": store.url, "AWS_ACCESS_KEY_ID": "bench",
                       "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
        conf = {**SPARK_CONF, **{f"spark.executorEnv.{name}": value for name, value in credentials.items()}}
        spark = sparktf.init_spark("local[2]", app_name="bench-input-s3", conf=conf)
        spark.sparkContext.setLogLevel("ERROR")
        os.environ.update(credentials)
        try:
            fs = fsspec.filesystem("s3")
            fs.mkdir("bench")
            local = sorted(os.path.join(folder, name) for name in os.listdir(folder))
            for path in local:
                fs.put_file(path, f"bench/jpeg/{os.path.basename(path)}")
            sides = {"local": (local, False), "s3": (["s3://bench/jpeg/*"], False),
                     "s3_distant": (["s3://bench/jpeg/*"], True)}
            optimizers = {}
            for name, (paths, distant) in sides.items():
                store.distant(distant)
                optimizers[name] = sparktf_optimizer(paths)[0]
            runs: Dict[str, List[dict]] = {name: [] for name in sides}
            for _ in range(rounds):
                for name, (_, distant) in sides.items():
                    store.distant(distant)
                    server_before, proxy_before = store.cpu_seconds()
                    started = time.perf_counter()
                    rate = sparktf_images_per_second(optimizers[name], epochs)[0]
                    seconds = time.perf_counter() - started
                    server, proxy = (after - before for after, before in
                                     zip(store.cpu_seconds(), (server_before, proxy_before)))
                    timings = optimizers[name].last_timings
                    runs[name].append({"images_per_second": rate, "seconds": seconds, "server_cpu_s": server,
                                       "proxy_cpu_s": proxy, "batches_s": timings.get("data", 0.0),
                                       "first_step_s": sum(timings.get(phase, 0.0) for phase in FIRST_STEP_PHASES)})
            return runs
        finally:
            spark.stop()


def report_storage(runs: Dict[str, List[dict]], jpegs: int) -> List[str]:
    """Print (c)'s rounds and the S3 server's share of the 2 cores; its RESULT lines."""
    best = {name: max(run["images_per_second"] for run in side) for name, side in runs.items()}
    print(f"(c) {jpegs} JPEG records, cache=False, 2 workers, {len(runs['local'])} interleaved rounds "
          f"(images/s; S3: the server's and the proxy's CPU seconds, the server's share of 2 cores):")
    for name, side in runs.items():
        print(f"    {name:>10} rank 0 waited for batches " + ", ".join(f"{run['batches_s']:.2f}" for run in side)
              + " s, to its first step " + ", ".join(f"{run['first_step_s']:.2f}" for run in side) + " s")
    for name, side in runs.items():
        print(f"    {name:>10}: " + ", ".join(
            f"{run['images_per_second']:.0f}" + ("" if name == "local" else
                                                  f" ({run['server_cpu_s']:.1f}+{run['proxy_cpu_s']:.1f} s, "
                                                  f"{run['server_cpu_s'] / (2 * run['seconds']):.0%})")
            for run in side) + f"; best {best[name]:.0f}")
    for name in ("s3", "s3_distant"):
        ratios = [run["images_per_second"] / local["images_per_second"] for run, local in zip(runs[name], runs["local"])]
        print(f"    {name:>10} / local, round by round: " + ", ".join(f"{ratio:.3f}" for ratio in ratios))
    share = float(np.median([run["server_cpu_s"] / (2 * run["seconds"]) for run in runs["s3"]]))
    return [f"RESULT s3_server_cpu_share={share:.3f}",
            f"RESULT s3_direct_ratio={best['s3'] / best['local']:.3f}",
            f"RESULT s3_stream_ratio={best['s3_distant'] / best['local']:.3f}"]


# ---------------------------------------------------------------------------------------- (b) larger than memory


def wide_records(count: int) -> Callable:
    """``partition -> records`` for ``flatMap``: ``count`` records of :data:`WIDTH` float32 and a label."""

    def records(partition: int):
        rng = np.random.default_rng(partition)
        block = rng.normal(size=(1000, WIDTH)).astype(np.float32)
        for index in range(count):
            x = block[index % 1000]
            yield x, int(x[index % WIDTH] > 0)

    return records


def feed_rate(spark_conf: Dict[str, str], records: int, partitions: int) -> Dict[str, float]:
    """Records/s of a second ``optimize`` over ``records`` wide records, peak worker RssAnon, first-step time.

    In a session of its own (fresh Python workers); ``baseline_rss_anon_mb`` is a worker's after training
    the same model on 64 records (TensorFlow, the model, its traced step).
    """
    import keras

    import sparktf
    from sparktf import MaxEpoch, MaxIteration, TFDataset, TFOptimizer

    spark = sparktf.init_spark("local[2]", app_name="bench-input-feed", conf=spark_conf)
    spark.sparkContext.setLogLevel("ERROR")
    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy")
    x, y = map(np.array, zip(*wide_records(64)(0)))
    TFOptimizer.from_keras(model, TFDataset.from_ndarrays((x, y), batch_size=32)).optimize(MaxIteration(2), verbose=0)
    baseline = max(python_workers().values())
    rdd = spark.sparkContext.parallelize(range(partitions), partitions).flatMap(wide_records(records // partitions))
    dataset = TFDataset.from_rdd(rdd, features=("float32", [WIDTH]), labels=("int32", []),
                                 batch_size=FEED_BATCH, seed=1)
    dataset.num_records  # Spark caches the records (not timed)
    optimizer = TFOptimizer.from_keras(model, dataset, num_workers=2)
    with PeakSampler() as memory:
        optimizer.optimize(MaxEpoch(1), verbose=0)  # spills each shard to local disk, first pass
        first_pass = dict(optimizer.last_timings)
        started = time.perf_counter()
        optimizer.optimize(MaxEpoch(2), verbose=0)
        seconds = time.perf_counter() - started
    timings = optimizer.last_timings
    iterations = dataset.iterations_per_epoch(2)
    spark.stop()
    return {
        "records_per_second": iterations * FEED_BATCH / seconds,
        "baseline_rss_anon_mb": baseline / 2**20,
        "peak_rss_anon_mb": memory.peak / 2**20,
        "first_segment_data_cache_s": first_pass.get("data_cache", 0.0),
        "second_segment_first_step_s": sum(timings.get(phase, 0.0) for phase in FIRST_STEP_PHASES),
        "second_segment_data_cache_s": timings.get("data_cache", 0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller data (a few minutes)")
    parser.add_argument("--part", choices=("a", "b", "c", "both"), default="both",
                        help="run only (a), (b) or (c); both: all three")
    parser.add_argument("--single", nargs=2, metavar=("FOLDER", "RECORDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.single:
        folder, records = args.single[0], int(args.single[1])
        paths = sorted(os.path.join(folder, name) for name in os.listdir(folder))
        print(json.dumps({"images_per_second": one_process_images_per_second(paths, records)}))
        return

    import sparktf
    from sparktf.spark.cluster import TRAIN_DATA_MEMORY_CONF

    spark_conf = SPARK_CONF
    jpegs, epochs = (800, 3) if args.quick else (2000, 5)
    big, small = ((200 << 20), (20 << 20)) if args.quick else ((2 << 30), (200 << 20))
    if args.quick:  # the streamed case streams at this size too
        spark_conf = {**SPARK_CONF, TRAIN_DATA_MEMORY_CONF: "32m"}
    results = []
    if args.part in ("a", "both"):
        spark = sparktf.init_spark("local[2]", app_name="bench-input", conf=spark_conf)
        spark.sparkContext.setLogLevel("ERROR")
        with tempfile.TemporaryDirectory() as folder:
            write_jpeg_records(folder, jpegs)
            rounds = 1 if args.quick else 3
            single, distributed, overhead, window, timings = compare_jpeg_pipelines(folder, jpegs, rounds)
        print(f"(a) {jpegs} JPEG records, windows of >= {WINDOW_SECONDS:g} s (sparktf: {window} epochs a call), "
              f"best of {rounds} interleaved round(s): one process {single:.0f} images/s, sparktf 2 workers "
              f"cache=False {distributed:.0f} images/s")
        print("    where the time went on rank 0: " + " ".join(f"{k}={v:.2f}s" for k, v in timings.items()))
        results.append(f"RESULT stream_ratio={distributed / single:.3f}")
        results.append(f"RESULT call_overhead_s={overhead:.3f}")
        spark.stop()
    if args.part in ("b", "both"):
        rates = {}
        for name, size in (("streamed", big), ("in_memory", small)):
            rates[name] = feed_rate(spark_conf, size // (WIDTH * 4 + 4), 4)
            print(f"(b) {name}: {size >> 20} MB of records ({size >> 21} MB per worker): "
                  + " ".join(f"{k}={v:.2f}" for k, v in rates[name].items()))
        ratio = rates["streamed"]["records_per_second"] / rates["in_memory"]["records_per_second"]
        results.append(f"RESULT stream_feed_ratio={ratio:.3f}")
    if args.part in ("c", "both"):
        with tempfile.TemporaryDirectory() as folder:
            write_jpeg_records(folder, jpegs)
            results += report_storage(compare_storage(folder, epochs, rounds=3), jpegs)
    print("\n".join(results))


if __name__ == "__main__":
    main()
