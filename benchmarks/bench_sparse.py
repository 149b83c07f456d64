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
* **DLRM shaped like Criteo**: 26 categorical features, each its own table
  of 16 with Criteo Kaggle's cardinalities capped at 2^18 rows (1.86 M rows
  in all), 13 dense features through a bottom MLP 64-16, the pairwise dot
  products of the 27 vectors, a top MLP 128-64, ``RowWiseAdagrad``, global
  batch 4,096.

The tables' update: sparktf applies Adagrad and ``RowWiseAdagrad`` to the
rows present only (``sparktf.training.tables.sparse_kernels``); ``fit`` with Keras'
Adagrad passes over every row. So Wide & Deep and DLRM are also run as one
process with the same sparse update (a ``tf.function`` step of forward,
gradients, ``apply_rows`` for the tables and ``optimizer.apply`` for the
rest, in a subprocess of its own): the ratio against it is the scaling alone.
Each case prints the largest peak RssAnon of a Python worker while sparktf
trained. ``--shard-table-bytes 1m`` shards the tables over that size across
the 2 workers (``spark.sparktf.shardTableBytes``).

The bytes: rank 0 counts the gradient bytes it sent per step, and what the
dense exchange (every table all-reduced in full) would have sent
(``TFOptimizer.last_traffic``); ``sparse_bytes_ratio`` is NCF-SGD's dense
bytes over its sparse bytes.

Last lines::

    RESULT dlrm_ratio=<sparktf samples/s / fit samples/s>
    RESULT dlrm_same_update_ratio=<sparktf samples/s / one process with the same update>
    RESULT wide_deep_same_update_ratio=...
    RESULT sparse_ratio_sgd=<sparktf samples/s / fit samples/s>
    RESULT sparse_ratio_adam=...
    RESULT wide_deep_ratio=...
    RESULT sparse_bytes_ratio=<dense bytes per step / sparse bytes per step>

Run ``flock /tmp/sparktf-bench.lock python benchmarks/bench_sparse.py [--quick] [--only dlrm,wide_deep]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # worker_memory beside this file

USERS, ITEMS = 138_493, 26_744
HASH_BUCKETS, CATEGORICAL, NUMERIC = 1 << 20, 26, 13
GLOBAL_BATCH = 2048
ITERATIONS = {"full": 160, "quick": 30}
ROUNDS = {"full": 2, "quick": 1}
WORKLOADS = (("ncf", "sgd"), ("ncf", "adam"), ("wide_deep", "adagrad"), ("dlrm", "row_wise_adagrad"))
#: Criteo Kaggle's 26 categorical cardinalities, each capped at DLRM_MAX_ROWS so that the tables fit here.
CRITEO_CARDINALITIES = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
                        14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
DLRM_MAX_ROWS, DLRM_DIM, DLRM_BATCH = 1 << 18, 16, 4096
SAME_UPDATE_KINDS = ("wide_deep", "dlrm")


def global_batch(kind: str) -> int:
    return DLRM_BATCH if kind == "dlrm" else GLOBAL_BATCH


def dlrm_rows():
    return [min(rows, DLRM_MAX_ROWS) for rows in CRITEO_CARDINALITIES]


def build_model(kind: str, optimizer: str, ncf_rows=(USERS, ITEMS)):
    import keras

    from sparktf.optimizers import RowWiseAdagrad

    keras.utils.set_random_seed(0)
    optimizers = {"sgd": lambda: keras.optimizers.SGD(0.05), "adam": lambda: keras.optimizers.Adam(1e-3),
                  "adagrad": lambda: keras.optimizers.Adagrad(0.05),
                  "row_wise_adagrad": lambda: RowWiseAdagrad(0.05)}
    if kind == "dlrm":
        model = build_dlrm()
    elif kind == "ncf":
        user, item = keras.Input((1,), dtype="int32", name="user"), keras.Input((1,), dtype="int32", name="item")

        def embedded(ids, rows, width):
            return keras.layers.Flatten()(keras.layers.Embedding(rows, width)(ids))

        users, items = ncf_rows
        gmf = keras.layers.Multiply()([embedded(user, users, 32), embedded(item, items, 32)])
        mlp = keras.layers.Concatenate()([embedded(user, users, 64), embedded(item, items, 64)])
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


def build_dlrm():
    """DLRM: a bottom MLP on the dense features, one table per categorical one, their dot products, a top MLP."""
    import keras

    ids = keras.Input((len(CRITEO_CARDINALITIES),), dtype="int32", name="categorical")
    numeric = keras.Input((NUMERIC,), name="numeric")
    bottom = keras.layers.Dense(64, activation="relu")(numeric)
    bottom = keras.layers.Dense(DLRM_DIM, activation="relu")(bottom)
    vectors = [bottom] + [keras.layers.Embedding(rows, DLRM_DIM, name=f"table_{i}")(ids[:, i])
                          for i, rows in enumerate(dlrm_rows())]
    stacked = keras.ops.stack(vectors, axis=1)
    dots = keras.ops.reshape(keras.ops.matmul(stacked, keras.ops.transpose(stacked, (0, 2, 1))), (-1, 27 * 27))
    pairs = [i * 27 + j for i in range(27) for j in range(i + 1, 27)]
    top = keras.layers.Concatenate()([bottom, keras.ops.take(dots, np.array(pairs), axis=1)])
    for width in (128, 64):
        top = keras.layers.Dense(width, activation="relu")(top)
    return keras.Model([ids, numeric], keras.layers.Dense(1, activation="sigmoid")(top))


def make_data(kind: str, records: int, ncf_rows=(USERS, ITEMS)):
    """Interactions: uniform users and Zipf items (NCF), or Zipf hashed ids per feature (Wide & Deep)."""
    rng = np.random.default_rng(1)
    labels = (rng.random((records, 1)) < 0.05).astype(np.float32)
    if kind == "ncf":
        users = rng.integers(0, ncf_rows[0], (records, 1)).astype(np.int32)
        items = ((rng.zipf(1.2, (records, 1)) - 1) % ncf_rows[1]).astype(np.int32)
        return [users, items], labels
    if kind == "dlrm":
        ids = np.stack([(rng.zipf(1.2, records) - 1) % rows for rows in dlrm_rows()], axis=1).astype(np.int32)
        return [ids, rng.normal(size=(records, NUMERIC)).astype(np.float32)], labels
    offsets = rng.integers(0, HASH_BUCKETS, CATEGORICAL)  # each feature's values hash all over the table
    ids = ((rng.zipf(1.3, (records, CATEGORICAL)) + offsets) % HASH_BUCKETS).astype(np.int32)
    return [ids, rng.normal(size=(records, NUMERIC)).astype(np.float32)], labels


def one_process(kind: str, optimizer: str, iterations: int, method: str) -> float:
    """Samples/s of ``model.fit`` (or the same-update loop) on in-memory arrays, timed after a traced start."""
    model = build_model(kind, optimizer)
    batch = global_batch(kind)
    features, labels = make_data(kind, batch * iterations)
    if method == "same_update":
        return same_update_loop(model, features, labels, batch, iterations)
    model.fit(features, labels, batch_size=batch, epochs=1, steps_per_epoch=5, verbose=0, shuffle=False)
    started = time.perf_counter()
    model.fit(features, labels, batch_size=batch, epochs=1, verbose=0, shuffle=False)
    return batch * iterations / (time.perf_counter() - started)


def same_update_loop(model, features, labels, batch: int, iterations: int) -> float:
    """Samples/s of a one-process loop that updates the tables as sparktf does: their rows present only."""
    import tensorflow as tf

    from sparktf.training.tables.sparse_kernels import apply_rows

    optimizer, variables = model.optimizer, model.trainable_variables
    optimizer.build(variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
        dense = []
        for gradient, variable in zip(tape.gradient(loss, variables), variables):
            if isinstance(gradient, tf.IndexedSlices):
                apply_rows(optimizer, variable, gradient)
            else:
                dense.append((gradient, variable))
        optimizer.apply(*zip(*dense))
        return loss

    batches = [([part[i * batch:(i + 1) * batch] for part in features], labels[i * batch:(i + 1) * batch])
               for i in range(iterations)]
    for x, y in batches[:5]:
        float(step(x, y))
    started = time.perf_counter()
    for x, y in batches:
        loss = step(x, y)
    float(loss)
    return batch * iterations / (time.perf_counter() - started)


def run_one_process(kind: str, optimizer: str, iterations: int, method: str = "fit") -> float:
    """:func:`one_process` in a fresh subprocess, owning TensorFlow's default thread pools."""
    out = subprocess.run([sys.executable, __file__, "--single", kind, optimizer, str(iterations), method],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["samples_per_second"]


def run_sparktf(kind: str, optimizer: str, iterations: int):
    """Samples/s of a warm 2-worker ``optimize`` of ``iterations`` steps; rank 0's timings and traffic."""
    from sparktf import MaxIteration, TFDataset, TFOptimizer

    from worker_memory import PeakSampler

    batch = global_batch(kind)
    dataset = TFDataset.from_ndarrays(make_data(kind, batch * iterations), batch_size=batch,
                                      num_partitions=2, shuffle=False)
    dataset.num_records
    trainer = TFOptimizer.from_keras(build_model(kind, optimizer), dataset, num_workers=2)
    warm = MaxIteration(5)
    trainer.optimize(end_trigger=warm, checkpoint_trigger=warm, verbose=0)
    end = MaxIteration(iterations)
    with PeakSampler(interval=0.2) as memory:
        started = time.perf_counter()
        history = trainer.optimize(end_trigger=end, checkpoint_trigger=end, verbose=0)
        seconds = time.perf_counter() - started
    assert history["iterations"] == iterations, history["iterations"]
    steps = iterations - 5
    print(f"{kind} {optimizer} per rank and step: " + "; ".join(
        f"rank {rank} " + " ".join(f"{phase}={1000 * timings.get(phase, 0.0) / steps:.2f}ms" for phase in
                                   ("data", "lookup", "compute", "exchange_wait", "transfer", "apply"))
        for rank, timings in sorted(trainer.rank_timings.items())))
    return batch * steps / seconds, trainer.last_timings, trainer.last_traffic, memory.peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few iterations (about 3 minutes)")
    parser.add_argument("--only", help="comma-separated model kinds (ncf, wide_deep, dlrm); default all")
    parser.add_argument("--shard-table-bytes", help="spark.sparktf.shardTableBytes for sparktf's runs (e.g. 1m): "
                        "its larger tables are sharded across the 2 workers; default: every table replicated")
    parser.add_argument("--single", nargs=4, metavar=("KIND", "OPTIMIZER", "ITERATIONS", "METHOD"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.single:
        rate = one_process(args.single[0], args.single[1], int(args.single[2]), args.single[3])
        print(json.dumps({"samples_per_second": rate}))
        return
    kinds = args.only.split(",") if args.only else [kind for kind, _ in WORKLOADS]

    import sparktf

    iterations = ITERATIONS["quick" if args.quick else "full"]
    spark = sparktf.init_spark("local[2]", app_name="bench-sparse", conf={
        "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
        **({"spark.sparktf.shardTableBytes": args.shard_table_bytes} if args.shard_table_bytes else {})})
    spark.sparkContext.setLogLevel("ERROR")
    print(f"local[2] on {os.cpu_count()} cores; global batch {GLOBAL_BATCH} ({DLRM_BATCH} for DLRM), "
          f"{iterations} timed iterations; tables over {args.shard_table_bytes or 'no size'} sharded")
    results = {}
    for kind, optimizer in WORKLOADS:
        if kind in kinds:
            results[kind, optimizer] = compare(kind, optimizer, iterations, ROUNDS["quick" if args.quick else "full"])
    spark.stop()
    lines = [("dlrm", "row_wise_adagrad", "fit", "dlrm_ratio"),
             ("dlrm", "row_wise_adagrad", "same_update", "dlrm_same_update_ratio"),
             ("wide_deep", "adagrad", "same_update", "wide_deep_same_update_ratio"),
             ("wide_deep", "adagrad", "fit", "wide_deep_ratio"),
             ("ncf", "adam", "fit", "sparse_ratio_adam"),
             ("ncf", "sgd", "bytes", "sparse_bytes_ratio"),
             ("ncf", "sgd", "fit", "sparse_ratio_sgd")]
    for kind, optimizer, against, name in lines:
        if (kind, optimizer) in results:
            print(f"RESULT {name}={results[kind, optimizer][against]:.{1 if against == 'bytes' else 3}f}")


def compare(kind: str, optimizer: str, iterations: int, rounds: int) -> dict:
    """One workload's rounds (one process and sparktf alternating); prints them; its ratios and bytes ratio."""
    methods = ("fit", "same_update") if kind in SAME_UPDATE_KINDS else ("fit",)
    singles, runs = {method: [] for method in methods}, []
    for _ in range(rounds):
        for method in methods:
            singles[method].append(run_one_process(kind, optimizer, iterations, method))
        runs.append(run_sparktf(kind, optimizer, iterations))
    print(f"{kind:9s} {optimizer:7s} rounds: " + ", ".join(
        f"{method} {' '.join(f'{r:.0f}' for r in rates)}" for method, rates in singles.items())
        + f", sparktf {' '.join(f'{r[0]:.0f}' for r in runs)} samples/s")
    rate, timings, traffic, peak = max(runs, key=lambda run: run[0])
    best = {method: max(rates) for method, rates in singles.items()}
    steps = iterations - 5
    phases = " ".join(f"{p}={1000 * timings.get(p, 0.0) / steps:.2f}ms"
                      for p in ("data", "compute", "exchange", "apply"))
    sent, dense = traffic.sent / traffic.steps, traffic.dense / traffic.steps
    one_process_rates = " | ".join(f"{method} {value:9.0f} samples/s" for method, value in best.items())
    ratios = " ".join(f"ratio vs {method} {rate / value:.3f}" for method, value in best.items())
    print(f"{kind:9s} {optimizer:7s} {one_process_rates} | sparktf 2 workers {rate:9.0f} samples/s | {ratios} | "
          f"rank 0 per step: {phases} | gradient bytes sent {sent / 1e6:.3f} MB (dense {dense / 1e6:.1f} MB; "
          f"tables as rows {traffic.sparse_tables}, dense {traffic.dense_tables}, sharded {traffic.sharded_tables}) | "
          f"peak worker RssAnon {peak / 2**20:.0f} MB")
    return {**{method: rate / value for method, value in best.items()}, "bytes": dense / sent}


if __name__ == "__main__":
    main()
