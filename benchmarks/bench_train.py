"""Training benchmark: TFOptimizer on 1 and 2 barrier workers vs one plain TensorFlow process.

The same model, synthetic data, global batch and number of iterations for
every method, run side by side in one invocation:

* ``single_process`` (a): a plain loop in a subprocess with TensorFlow's
  default threads (all cores): ``tf.function`` of forward, loss, gradients
  and ``optimizer.apply`` on batches sliced from in-memory arrays; plain or
  XLA-compiled, whichever is faster on a few trial iterations (tracing and
  trials are not timed);
* ``sparktf_1w`` (b): ``TFOptimizer.optimize`` with ``num_workers=1``;
* ``sparktf_2w`` (c): the same with ``num_workers=2``.

The sparktf timings include the job launch, data caching, the model load in
the workers and tracing (everything ``optimize`` does); (a) does not.
The first job of a session (the CNN workload on 2 workers) finds Python
workers that have not imported TensorFlow yet, unless ``init_spark``'s
background warm-up did it while the user built the model. Both are timed
in sessions of their own, before the rest: ``train_ratio_2w_cold_no_warm_up``
(``spark.sparktf.warmUpWorkers=false``: the job starts the workers and
imports TensorFlow) and ``train_ratio_2w_cold_cnn`` (the default: the job
starts once the warm-up is done, as after building a model), next to the
same job warm (``train_ratio_2w_warm_cnn``). ``verbose1_ratio`` compares
the CNN job with the live progress bar (``verbose=1``) against ``verbose=0``,
alternating, median of 3 rounds (1.0: the display costs nothing). Two workloads: a small CNN on
32x32x3 images and an MLP on 256 floats. For each sparktf run, where the time
went on rank 0 is printed (launch, data cache, model load, connect, batches,
compute, all-reduce, apply).

Global batch 256 for the CNN and 512 for the MLP; in full mode 1700 and
3800 iterations, about 30-35 s of single-process work each, so (a) does
more than 60 s of work and each sparktf job's fixed cost (launch, model
load, tracing, rendezvous) counts as it would in a real run, not as 10-20 %
of a toy one. The same comparison at
the old global batch 64 (methods (a) and (c), fewer iterations) is printed
first as ``ratio_2w_batch64``. The last line is
``RESULT train_ratio_2w=<(c) records/s / (a) records/s>`` over both workloads
at the main batches (total records / total seconds).

``--cold-rounds N`` measures the cold first job alone, N times: each round
starts a fresh session in a subprocess (``init_spark``'s warm-up done, then
the CNN job on 2 workers, launch included) and runs (a) in another, and
prints each round's ratio and ``RESULT train_ratio_2w_cold_cnn=<median>``.

``--connect`` compares sessions instead: the CNN job on 2 workers
(``from_ndarrays``, ``TFOptimizer.optimize``, after one short warm job) in a
classic session and in a Spark Connect session, each in a process of its
own (a Connect client cannot share a process with a classic session), both
on ``local[2]``, alternating, best of the rounds; it prints
``RESULT connect_ratio=<Connect images/s / classic images/s>`` last.

Run ``flock /tmp/sparktf-bench.lock python benchmarks/bench_train.py [--quick] [--connect]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Dict

import numpy as np

RECORDS = 2048
WORKLOADS = ("cnn", "mlp")
GLOBAL_BATCH = {"cnn": 256, "mlp": 512}
FULL_ITERATIONS = {"cnn": 1700, "mlp": 3800}
QUICK_ITERATIONS = {"cnn": 20, "mlp": 60}
OLD_BATCH = 64
OLD_FULL_ITERATIONS = {"cnn": 200, "mlp": 600}
OLD_QUICK_ITERATIONS = {"cnn": 40, "mlp": 120}
CONNECT_ITERATIONS = {"full": 400, "quick": 40}
CONNECT_ROUNDS = {"full": 3, "quick": 1}
SESSION_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.python.worker.reuse": "true",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def build_model(kind: str):
    import keras

    keras.utils.set_random_seed(0)
    if kind == "cnn":
        layers = [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    else:
        layers = [
            keras.Input((256,)),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(10),
        ]
    model = keras.Sequential(layers)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def make_data(kind: str):
    rng = np.random.default_rng(0)
    shape = (32, 32, 3) if kind == "cnn" else (256,)
    x = rng.normal(size=(RECORDS, *shape)).astype(np.float32)
    y = rng.integers(0, 10, size=(RECORDS,)).astype(np.int32)
    return x, y


def single_process(kind: str, batch: int, iterations: int) -> float:
    """(a): seconds of a plain tf.function training loop in this process (after tracing)."""
    model = build_model(kind)
    x, y = make_data(kind)
    model.optimizer.build(model.trainable_variables)
    per_epoch = RECORDS // batch
    batches = [(x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]) for i in range(per_epoch)]
    step = faster_step(model, batches)
    started = time.perf_counter()
    for i in range(iterations):
        loss = step(*batches[i % per_epoch])
    float(loss)
    return time.perf_counter() - started


def faster_step(model, batches, trials: int = 5):
    """The faster of the plain and the XLA-compiled training step, each traced and timed on a few batches."""
    timed = []
    for jit_compile in (False, True):
        step = training_step(model, jit_compile)
        float(step(*batches[0]))  # trace (and compile)
        started = time.perf_counter()
        for i in range(trials):
            loss = step(*batches[i % len(batches)])
        float(loss)
        timed.append((time.perf_counter() - started, jit_compile, step))
    return min(timed, key=lambda entry: entry[:2])[2]


def training_step(model, jit_compile: bool):
    """One ``tf.function``: forward pass, loss, gradients, ``optimizer.apply``."""
    import tensorflow as tf

    variables = model.trainable_variables

    @tf.function(jit_compile=jit_compile)
    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x=features, y=labels, y_pred=model(features, training=True))
        model.optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    return step


def run_single_process(kind: str, batch: int, iterations: int) -> float:
    """Run (a) in a fresh subprocess so it owns TensorFlow's default thread pools."""
    out = subprocess.run(
        [sys.executable, __file__, "--single", kind, str(batch), str(iterations)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def run_sparktf(kind: str, batch: int, iterations: int, num_workers: int, verbose: int = 0):
    from sparktf import MaxIteration, TFDataset, TFOptimizer

    dataset = TFDataset.from_ndarrays(make_data(kind), batch_size=batch, num_partitions=2)
    dataset.num_records  # count once, outside the timing (a property of the data, cached)
    optimizer = TFOptimizer.from_keras(build_model(kind), dataset, num_workers=num_workers)
    started = time.perf_counter()
    end = MaxIteration(iterations)
    history = optimizer.optimize(end_trigger=end, checkpoint_trigger=end, verbose=verbose)
    seconds = time.perf_counter() - started
    assert history["iterations"] == iterations, history["iterations"]
    return seconds, optimizer.last_timings


def format_timings(timings: Dict[str, float], iterations: int) -> str:
    per_iteration = ("data", "compute", "exchange", "apply")
    once = [f"{name}={timings[name]:.2f}s" for name in timings if name not in per_iteration]
    each = [f"{name}={1000 * timings[name] / iterations:.2f}ms" for name in per_iteration]
    return "once: " + " ".join(once) + " | per iteration: " + " ".join(each)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few iterations (< 2 minutes)")
    parser.add_argument("--connect", action="store_true", help="Spark Connect against a classic session")
    parser.add_argument("--cold-rounds", type=int, metavar="N", help="only the cold first CNN job, N fresh sessions")
    parser.add_argument("--cold-job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--single", nargs=3, metavar=("KIND", "BATCH", "ITERATIONS"), help=argparse.SUPPRESS)
    parser.add_argument("--session-run", nargs=3, metavar=("SESSION", "ITERATIONS", "ROUNDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.single:
        kind, batch, iterations = args.single[0], int(args.single[1]), int(args.single[2])
        print(json.dumps({"seconds": single_process(kind, batch, iterations)}))
        return
    if args.session_run:
        print(json.dumps({"seconds": session_run(args.session_run[0], int(args.session_run[1]),
                                                 int(args.session_run[2]))}))
        return
    if args.connect:
        compare_sessions("quick" if args.quick else "full")
        return
    cnn_iterations = (QUICK_ITERATIONS if args.quick else FULL_ITERATIONS)["cnn"]
    if args.cold_job:
        print(json.dumps(cold_job(cnn_iterations)))
        return
    if args.cold_rounds:
        compare_cold(cnn_iterations, args.cold_rounds, args.quick)
        return

    import sparktf
    from sparktf.context import WARM_UP_CONF

    print(f"local[2] on {os.cpu_count()} cores; {RECORDS} records per workload")
    spark = sparktf.init_spark("local[2]", app_name="bench-train", conf={**SESSION_CONF, WARM_UP_CONF: "false"})
    unwarmed, _ = run_sparktf("cnn", GLOBAL_BATCH["cnn"], cnn_iterations, 2)
    print(f"cold, no warm-up: the first CNN job of a session starts 2 Python workers and imports TensorFlow: "
          f"{unwarmed:.1f}s")
    spark.stop()
    # the default; said explicitly because PySpark's session builder keeps the options of the earlier session
    spark = sparktf.init_spark("local[2]", app_name="bench-train", conf={**SESSION_CONF, WARM_UP_CONF: "true"})
    spark.sparkContext.setLogLevel("ERROR")
    warm_up_seconds = wait_for_warm_up()
    cold, _ = run_sparktf("cnn", GLOBAL_BATCH["cnn"], cnn_iterations, 2)
    print(f"cold: the first CNN job of a session after init_spark's warm-up ({warm_up_seconds:.1f}s, "
          f"while a user builds the model): {cold:.1f}s")

    old_batches = dict.fromkeys(WORKLOADS, OLD_BATCH)
    old, _ = compare(old_batches, OLD_QUICK_ITERATIONS if args.quick else OLD_FULL_ITERATIONS, (2,))
    print(f"ratio_2w_batch{OLD_BATCH}={old['sparktf_2w'] / old['single_process']:.3f}")
    rates, seconds = compare(GLOBAL_BATCH, QUICK_ITERATIONS if args.quick else FULL_ITERATIONS, (2, 1))
    print(f"RESULT train_ratio_2w_cold_no_warm_up={seconds['cnn']['single_process'] / unwarmed:.3f}")
    print(f"RESULT train_ratio_2w_cold_cnn={seconds['cnn']['single_process'] / cold:.3f}")
    print(f"RESULT train_ratio_2w_warm_cnn={seconds['cnn']['single_process'] / seconds['cnn']['sparktf_2w']:.3f}")
    print(f"RESULT verbose1_ratio={progress_ratio(cnn_iterations):.3f}")
    mlp_step = seconds["mlp"]["sparktf_2w"] / (QUICK_ITERATIONS if args.quick else FULL_ITERATIONS)["mlp"]
    clock = step_clock_seconds()
    print(f"step anatomy: the ranks' phase clock costs {clock * 1e6:.1f} us a step, against the MLP's "
          f"{mlp_step * 1e3:.2f} ms step on 2 workers (launch included)")
    print(f"RESULT anatomy_overhead={clock / mlp_step:.4f}")
    print(f"RESULT train_ratio_1w={rates['sparktf_1w'] / rates['single_process']:.3f}")
    print(f"RESULT train_ratio_2w={rates['sparktf_2w'] / rates['single_process']:.3f}")


def step_clock_seconds(steps: int = 20000) -> float:
    """What the per-step anatomy adds to a step on a rank: a ``PhaseClock`` step with its five laps and its sends'
    column (the timing itself, which a step does anyway, included), and a window's summary every 100 steps (the
    heartbeat takes one about once a second), median of 5 rounds, seconds per step."""
    from sparktf.training.worker.step_clock import PhaseClock

    rounds = []
    for _ in range(5):
        clock = PhaseClock()
        started = time.perf_counter()
        for iteration in range(1, steps + 1):
            clock.step(iteration)
            for phase in ("data", "lookup", "compute", "exchange", "apply"):
                clock.lap(phase)
            clock.add("send", 0.0)
            if iteration % 100 == 0:
                clock.take_window("")
        clock.anatomy(0, "", "")
        rounds.append((time.perf_counter() - started) / steps)
    return float(np.median(rounds))


def session_run(session: str, iterations: int, rounds: int) -> list:
    """Seconds of each round's timed CNN job on 2 workers in a ``classic`` or ``connect`` session on local[2]."""
    import sparktf

    conf = {"spark.driver.host": "127.0.0.1", "spark.ui.enabled": "false"}
    if session == "connect":
        spark = sparktf.init_spark(remote="local[2]", conf=conf)
    else:
        spark = sparktf.init_spark("local[2]", conf={**conf, "spark.driver.bindAddress": "127.0.0.1"})
    run_sparktf("cnn", GLOBAL_BATCH["cnn"], 5, 2)  # Python workers, TensorFlow and the model loaded
    seconds = [run_sparktf("cnn", GLOBAL_BATCH["cnn"], iterations, 2)[0] for _ in range(rounds)]
    spark.stop()
    return seconds


def compare_sessions(mode: str) -> None:
    """Classic against Spark Connect, each session in a subprocess, alternating; prints RESULT connect_ratio."""
    iterations, rounds = CONNECT_ITERATIONS[mode], CONNECT_ROUNDS[mode]
    images = iterations * GLOBAL_BATCH["cnn"]
    best = {}
    for session in ("classic", "connect", "classic", "connect"):
        out = subprocess.run([sys.executable, __file__, "--session-run", session, str(iterations), str(rounds)],
                             check=True, capture_output=True, text=True, timeout=1200).stdout
        seconds = json.loads(out.strip().splitlines()[-1])["seconds"]
        print(f"{session:8s} CNN 2 workers {iterations} iterations: " + ", ".join(f"{s:.2f}s" for s in seconds)
              + f" ({images / min(seconds):.0f} images/s best)")
        best[session] = min(best.get(session, float("inf")), *seconds)
    for session, value in best.items():
        print(f"{session:8s} best {images / value:.0f} images/s")
    print(f"RESULT connect_ratio={best['classic'] / best['connect']:.3f}")


def cold_job(iterations: int) -> dict:
    """A fresh session's first CNN job on 2 workers, after ``init_spark``'s warm-up: seconds and rank 0's timings."""
    import sparktf

    spark = sparktf.init_spark("local[2]", app_name="bench-train-cold", conf=SESSION_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    warm_up = wait_for_warm_up()
    seconds, timings = run_sparktf("cnn", GLOBAL_BATCH["cnn"], iterations, 2)
    spark.stop()
    return {"seconds": seconds, "warm_up": warm_up, "timings": timings}


def compare_cold(iterations: int, rounds: int, quick: bool) -> None:
    """Rounds of (a) and a fresh session's cold CNN job, each in a subprocess; prints the median ratio."""
    ratios = []
    for round_number in range(rounds):
        single = run_single_process("cnn", GLOBAL_BATCH["cnn"], iterations)
        out = subprocess.run([sys.executable, __file__, "--cold-job"] + (["--quick"] if quick else []),
                             check=True, capture_output=True, text=True).stdout
        cold = json.loads(out.strip().splitlines()[-1])
        ratios.append(single / cold["seconds"])
        print(f"round {round_number}: (a) {single:.2f}s, cold 2 workers {cold['seconds']:.2f}s "
              f"(warm-up {cold['warm_up']:.1f}s) ratio {ratios[-1]:.3f}; rank 0: "
              f"{format_timings(cold['timings'], iterations)}", flush=True)
    print(f"RESULT train_ratio_2w_cold_cnn={float(np.median(ratios)):.3f}")


def wait_for_warm_up() -> float:
    """Seconds until the background warm-up ``init_spark`` started has finished."""
    from sparktf.context import WARM_UP_SECONDS

    started = time.perf_counter()
    for thread in threading.enumerate():
        if thread.name == "sparktf-warm-up":
            thread.join(timeout=WARM_UP_SECONDS)
    return time.perf_counter() - started


def progress_ratio(iterations: int, rounds: int = 3) -> float:
    """Median over rounds of (seconds with verbose=0) / (seconds with verbose=1), CNN on 2 workers, alternating."""
    ratios = []
    for _ in range(rounds):
        silent, _ = run_sparktf("cnn", GLOBAL_BATCH["cnn"], iterations, 2, verbose=0)
        shown, _ = run_sparktf("cnn", GLOBAL_BATCH["cnn"], iterations, 2, verbose=1)
        ratios.append(silent / shown)
        print(f"  verbose=0 {silent:.2f}s, verbose=1 {shown:.2f}s")
    return float(np.median(ratios))


def compare(batches: Dict[str, int], iterations: Dict[str, int], worker_counts: tuple):
    """Run (a) and sparktf on ``worker_counts`` workers per workload; print and return records/s and seconds.

    Every workload's (a) and 2-worker run come before any 1-worker run: while
    a 1-worker job runs for over a minute no task finishes, so Spark stops the
    other, idle Python worker (PythonWorkerFactory's 1-minute idle timeout),
    and a 2-worker job after it would start a fresh worker and import
    TensorFlow in it (~4 s), a one-time cost the warm-up already counted.
    """
    seconds: Dict[str, Dict[str, float]] = {kind: {} for kind in WORKLOADS}
    for workers in sorted(worker_counts, reverse=True):
        for kind in WORKLOADS:
            batch, n = batches[kind], iterations[kind]
            if not seconds[kind]:
                seconds[kind]["single_process"] = run_single_process(kind, batch, n)
            seconds[kind][f"sparktf_{workers}w"], timings = run_sparktf(kind, batch, n, workers)
            print(f"  {kind} batch {batch} sparktf_{workers}w where the time went (rank 0): "
                  f"{format_timings(timings, n)}")
    for kind in WORKLOADS:
        batch, n = batches[kind], iterations[kind]
        for method, value in seconds[kind].items():
            print(f"{kind:4s} batch {batch:3d} {method:15s} {n:5d} iterations {value:7.2f}s "
                  f"{n * batch / value:9.0f} records/s")
        print(f"{kind:4s} batch {batch:3d} ratio (c)/(a) = "
              f"{seconds[kind]['single_process'] / seconds[kind]['sparktf_2w']:.3f}")
    records = sum(batches[kind] * iterations[kind] for kind in WORKLOADS)
    rates = {
        method: records / sum(seconds[kind][method] for kind in WORKLOADS)
        for method in seconds[WORKLOADS[0]]
    }
    for method, rate in rates.items():
        print(f"all  {method:15s} {rate:9.0f} records/s")
    return rates, seconds


if __name__ == "__main__":
    main()
