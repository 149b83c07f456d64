"""Seed-scale training benchmark: ResNet-50 (32x32x3, global batch 32) through TFOptimizer vs plain Keras ``fit``.

Side by side in one invocation:

* ``keras_fit`` (a): ``model.fit`` in a fresh subprocess with TensorFlow's
  default threads (both cores), after an untimed warm-up ``fit`` that traces;
* ``sparktf_2w`` (c): ``TFOptimizer.optimize`` on 2 barrier workers, the same
  iterations split into 3 segments (3 ``optimize`` calls), so the model state
  (~190 MB with SGD momentum) moves driver -> workers -> driver 3 times; an
  untimed warm-up ``optimize`` first starts the Python workers and traces;
* the state's movement per segment (rank 0's ``state_fetch`` and
  ``state_upload`` seconds, and MB/s) against the loopback socket bandwidth
  measured with a plain socket in this process (one copy into a preallocated
  array, as the job channel does).

Last lines: ``RESULT resnet50_ratio=<(c) images/s / (a) images/s>`` and
``RESULT state_bandwidth_ratio=<state MB/s / loopback MB/s>``.

Run ``flock /tmp/sparktf-bench.lock python benchmarks/bench_resnet.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time

import numpy as np

BATCH = 32
RECORDS = 512
FULL_ITERATIONS = 150
QUICK_ITERATIONS = 6
SEGMENTS = 3


def build_model():
    import keras

    model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
    return model


def make_data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(RECORDS, 32, 32, 3)).astype(np.float32), rng.integers(0, 10, RECORDS).astype(np.int32)


def keras_fit(iterations: int) -> float:
    """(a): seconds of ``model.fit`` over ``iterations`` batches (after a traced warm-up)."""
    import tensorflow as tf

    model = build_model()
    x, y = make_data()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True).repeat().prefetch(2)
    model.fit(data, steps_per_epoch=3, epochs=1, verbose=0)
    started = time.perf_counter()
    model.fit(data, steps_per_epoch=iterations, epochs=1, verbose=0)
    return time.perf_counter() - started


def run_keras_fit(iterations: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--fit", str(iterations)], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def run_sparktf(iterations: int):
    """(c): seconds of ``iterations`` in SEGMENTS optimize calls on 2 workers, and each segment's timings."""
    import sparktf
    from sparktf import MaxIteration, TFDataset, TFOptimizer

    sparktf.init_spark("local[2]", conf={"spark.driver.host": "127.0.0.1", "spark.ui.showConsoleProgress": "false"})
    dataset = TFDataset.from_ndarrays(make_data(), batch_size=BATCH, num_partitions=2)
    dataset.num_records
    model = build_model()
    TFOptimizer.from_keras(model, dataset, num_workers=2).optimize(MaxIteration(2))  # workers up, step traced
    optimizer = TFOptimizer.from_keras(model, dataset, num_workers=2)
    segments = []
    started = time.perf_counter()
    for segment in range(1, SEGMENTS + 1):
        optimizer.optimize(MaxIteration(iterations * segment // SEGMENTS))
        segments.append(dict(optimizer.last_timings))
    seconds = time.perf_counter() - started
    state_mb = sum(np.asarray(v).nbytes for v in model.weights + model.optimizer.variables) / 2**20
    return seconds, segments, state_mb


def loopback_mb_per_s(megabytes: float) -> float:
    """One transfer of ``megabytes`` over a 127.0.0.1 socket into a preallocated array."""
    payload = np.ones(int(megabytes * 2**20), np.uint8)
    target = np.empty_like(payload)
    with socket.create_server(("127.0.0.1", 0)) as server:
        sender = threading.Thread(target=lambda: socket.create_connection(server.getsockname()).sendall(payload))
        started = time.perf_counter()
        sender.start()
        conn, _ = server.accept()
        with conn:
            view = memoryview(target)
            while view.nbytes:
                view = view[conn.recv_into(view):]
        seconds = time.perf_counter() - started
        sender.join()
    return megabytes / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few iterations (smoke run)")
    parser.add_argument("--fit", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fit:
        print(json.dumps({"seconds": keras_fit(args.fit)}))
        return
    iterations = QUICK_ITERATIONS if args.quick else FULL_ITERATIONS
    fit_seconds = run_keras_fit(iterations)
    spark_seconds, segments, state_mb = run_sparktf(iterations)
    images = iterations * BATCH
    print(f"keras_fit: {images / fit_seconds:.1f} images/s ({fit_seconds:.1f} s)")
    print(f"sparktf_2w: {images / spark_seconds:.1f} images/s ({spark_seconds:.1f} s, {SEGMENTS} segments)")
    moving = [t.get("state_fetch", 0.0) + t.get("state_upload", 0.0) for t in segments]
    for number, timings in enumerate(segments, 1):
        print(f"segment {number}: state_fetch={timings.get('state_fetch', 0):.2f}s "
              f"state_upload={timings.get('state_upload', 0):.2f}s launch={timings.get('launch', 0):.2f}s")
    state_rate = 2 * state_mb / (sum(moving) / len(moving))
    loopback = loopback_mb_per_s(state_mb)
    print(f"state {state_mb:.0f} MB: {state_rate:.0f} MB/s moved (fetch + upload), loopback {loopback:.0f} MB/s")
    print(f"RESULT state_bandwidth_ratio={state_rate / loopback:.3f}")
    print(f"RESULT resnet50_ratio={fit_seconds / spark_seconds:.3f}")


if __name__ == "__main__":
    main()
