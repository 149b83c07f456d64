"""Recommendation and CTR models: sparktf on 2 workers against one process's ``model.fit`` on the same cores.

Side by side in one run, every model warm (traced once before the timed run
on both sides), the two sides alternating over rounds and the best round of
each taken (single numbers on a shared VM move by up to 2x between runs):

* **NCF shaped like MovieLens-20M**: 138,493 users and 26,744 items, GMF
  embeddings of 32 and MLP embeddings of 64 (MLP 128-64-32), Zipf item ids,
  global batch 2,048, with SGD and with Adam. ``fit`` runs in a subprocess of
  its own with TensorFlow's default threads (both cores); sparktf runs
  ``TFOptimizer.optimize`` with 2 workers on ``local[2]``, timed on a second
  call after a short first one (the workers hold the traced model).
* **Wide & Deep**: 26 hashed categorical features sharing one 2^20 x 16
  table (and a 2^20 x 1 wide table), 13 dense features, MLP 256-128, Adagrad,
  global batch 2,048.

The bytes: rank 0 counts the gradient bytes it sent per step, and what the
dense exchange (every table all-reduced in full) would have sent
(``TFOptimizer.last_traffic``); ``sparse_bytes_ratio`` is NCF-SGD's dense
bytes over its sparse bytes.

Last lines::

    RESULT sparse_ratio_sgd=<sparktf samples/s / fit samples/s>
    RESULT sparse_ratio_adam=...
    RESULT wide_deep_ratio=...
    RESULT sparse_bytes_ratio=<dense bytes per step / sparse bytes per step>

Run ``flock /tmp/sparktf-bench.lock python benchmarks/bench_sparse.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

USERS, ITEMS = 138_493, 26_744
HASH_BUCKETS, CATEGORICAL, NUMERIC = 1 << 20, 26, 13
GLOBAL_BATCH = 2048
ITERATIONS = {"full": 160, "quick": 30}
ROUNDS = {"full": 2, "quick": 1}
WORKLOADS = (("ncf", "sgd"), ("ncf", "adam"), ("wide_deep", "adagrad"))


def build_model(kind: str, optimizer: str):
    import keras

    keras.utils.set_random_seed(0)
    optimizers = {"sgd": lambda: keras.optimizers.SGD(0.05), "adam": lambda: keras.optimizers.Adam(1e-3),
                  "adagrad": lambda: keras.optimizers.Adagrad(0.05)}
    if kind == "ncf":
        user, item = keras.Input((1,), dtype="int32", name="user"), keras.Input((1,), dtype="int32", name="item")

        def embedded(ids, rows, width):
            return keras.layers.Flatten()(keras.layers.Embedding(rows, width)(ids))

        gmf = keras.layers.Multiply()([embedded(user, USERS, 32), embedded(item, ITEMS, 32)])
        mlp = keras.layers.Concatenate()([embedded(user, USERS, 64), embedded(item, ITEMS, 64)])
        for width in (128, 64, 32):
            mlp = keras.layers.Dense(width, activation="relu")(mlp)
        output = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Concatenate()([gmf, mlp]))
        model = keras.Model([user, item], output)
    else:
        ids = keras.Input((CATEGORICAL,), dtype="int32", name="categorical")
        numeric = keras.Input((NUMERIC,), name="numeric")
        deep = keras.layers.Flatten()(keras.layers.Embedding(HASH_BUCKETS, 16)(ids))
        deep = keras.layers.Concatenate()([deep, numeric])
        for width in (256, 128):
            deep = keras.layers.Dense(width, activation="relu")(deep)
        wide = keras.layers.Flatten()(keras.layers.Embedding(HASH_BUCKETS, 1)(ids))
        logit = keras.layers.Add()([keras.layers.Dense(1)(deep), keras.layers.Dense(1)(wide)])
        model = keras.Model([ids, numeric], keras.layers.Activation("sigmoid")(logit))
    model.compile(optimizers[optimizer](), "binary_crossentropy")
    return model


def make_data(kind: str, records: int):
    """Interactions: uniform users and Zipf items (NCF), or Zipf hashed ids per feature (Wide & Deep)."""
    rng = np.random.default_rng(1)
    labels = (rng.random((records, 1)) < 0.05).astype(np.float32)
    if kind == "ncf":
        users = rng.integers(0, USERS, (records, 1)).astype(np.int32)
        items = ((rng.zipf(1.2, (records, 1)) - 1) % ITEMS).astype(np.int32)
        return [users, items], labels
    offsets = rng.integers(0, HASH_BUCKETS, CATEGORICAL)  # each feature's values hash all over the table
    ids = ((rng.zipf(1.3, (records, CATEGORICAL)) + offsets) % HASH_BUCKETS).astype(np.int32)
    return [ids, rng.normal(size=(records, NUMERIC)).astype(np.float32)], labels


def one_process(kind: str, optimizer: str, iterations: int) -> float:
    """Samples/s of ``model.fit`` on in-memory arrays, timed after a traced first epoch."""
    model = build_model(kind, optimizer)
    features, labels = make_data(kind, GLOBAL_BATCH * iterations)
    model.fit(features, labels, batch_size=GLOBAL_BATCH, epochs=1, steps_per_epoch=5, verbose=0, shuffle=False)
    started = time.perf_counter()
    model.fit(features, labels, batch_size=GLOBAL_BATCH, epochs=1, verbose=0, shuffle=False)
    return GLOBAL_BATCH * iterations / (time.perf_counter() - started)


def run_one_process(kind: str, optimizer: str, iterations: int) -> float:
    """:func:`one_process` in a fresh subprocess, owning TensorFlow's default thread pools."""
    out = subprocess.run([sys.executable, __file__, "--single", kind, optimizer, str(iterations)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["samples_per_second"]


def run_sparktf(kind: str, optimizer: str, iterations: int):
    """Samples/s of a warm 2-worker ``optimize`` of ``iterations`` steps; rank 0's timings and traffic."""
    from sparktf import MaxIteration, TFDataset, TFOptimizer

    dataset = TFDataset.from_ndarrays(make_data(kind, GLOBAL_BATCH * iterations), batch_size=GLOBAL_BATCH,
                                      num_partitions=2, shuffle=False)
    dataset.num_records
    trainer = TFOptimizer.from_keras(build_model(kind, optimizer), dataset, num_workers=2)
    warm = MaxIteration(5)
    trainer.optimize(end_trigger=warm, checkpoint_trigger=warm, verbose=0)
    end = MaxIteration(iterations)
    started = time.perf_counter()
    history = trainer.optimize(end_trigger=end, checkpoint_trigger=end, verbose=0)
    seconds = time.perf_counter() - started
    assert history["iterations"] == iterations, history["iterations"]
    return GLOBAL_BATCH * (iterations - 5) / seconds, trainer.last_timings, trainer.last_traffic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few iterations (about 3 minutes)")
    parser.add_argument("--single", nargs=3, metavar=("KIND", "OPTIMIZER", "ITERATIONS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.single:
        rate = one_process(args.single[0], args.single[1], int(args.single[2]))
        print(json.dumps({"samples_per_second": rate}))
        return

    import sparktf

    iterations = ITERATIONS["quick" if args.quick else "full"]
    spark = sparktf.init_spark("local[2]", app_name="bench-sparse", conf={
        "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    spark.sparkContext.setLogLevel("ERROR")
    print(f"local[2] on {os.cpu_count()} cores; global batch {GLOBAL_BATCH}, {iterations} timed iterations")
    ratios, bytes_ratio = {}, None
    for kind, optimizer in WORKLOADS:
        singles, runs = [], []
        for _ in range(ROUNDS["quick" if args.quick else "full"]):
            singles.append(run_one_process(kind, optimizer, iterations))
            runs.append(run_sparktf(kind, optimizer, iterations))
        print(f"{kind:9s} {optimizer:7s} rounds: fit {' '.join(f'{r:.0f}' for r in singles)}, sparktf "
              f"{' '.join(f'{r[0]:.0f}' for r in runs)} samples/s")
        single, (rate, timings, traffic) = max(singles), max(runs, key=lambda run: run[0])
        ratios[(kind, optimizer)] = rate / single
        steps = iterations - 5
        phases = " ".join(f"{p}={1000 * timings.get(p, 0.0) / steps:.2f}ms"
                          for p in ("batches", "compute", "allreduce", "apply"))
        sent, dense = traffic.sent / traffic.steps, traffic.dense / traffic.steps
        print(f"{kind:9s} {optimizer:7s} fit {single:9.0f} samples/s | sparktf 2 workers {rate:9.0f} samples/s | "
              f"ratio {rate / single:.3f} | rank 0 per step: {phases} | gradient bytes sent {sent / 1e6:.3f} MB "
              f"(dense {dense / 1e6:.1f} MB; tables as rows {traffic.sparse_tables}, dense {traffic.dense_tables})")
        if (kind, optimizer) == ("ncf", "sgd"):
            bytes_ratio = dense / sent
    spark.stop()
    print(f"RESULT wide_deep_ratio={ratios[('wide_deep', 'adagrad')]:.3f}")
    print(f"RESULT sparse_ratio_adam={ratios[('ncf', 'adam')]:.3f}")
    print(f"RESULT sparse_bytes_ratio={bytes_ratio:.1f}")
    print(f"RESULT sparse_ratio_sgd={ratios[('ncf', 'sgd')]:.3f}")


if __name__ == "__main__":
    main()
