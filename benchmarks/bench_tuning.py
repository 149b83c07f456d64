"""Model selection on one cluster: a CrossValidator grid trained one model at a time vs several at once.

An 8-configuration grid (learning rate 0.01, 0.03, 0.1, 0.3 x hidden width 8, 16) over 2 folds of a
small MLP (16 features -> width -> 2 classes, full-batch Adam: each fold's 1,024 training rows are one
global batch, so 1 and 2 workers compute the same updates), with ``sparktf.ml.KerasEstimator`` under
``pyspark.ml.tuning.CrossValidator``:

(a) ``local[2]``: serial (``parallelism=1``), each model on 2 workers, against ``parallelism=2``, each model
    on 1 worker (``numWorkers`` unset: the free slots over the parallelism). Every configuration's mean and
    standard deviation of the folds' log loss must be equal between the runs (atol 1e-5).
    ``RESULT tuning_speedup`` = serial wall time / parallel wall time (goal >= 1.25 on 2 cores, where the
    gain can only come from overlapping the trials' fixed costs: launching jobs, laying out data, building
    and tracing the model, validation, and the workers' waits for each other).
(b) ``local-cluster[4,1,1024]`` (four 1-core executors): the same grid with ``parallelism=4`` (1 worker
    each) against serial on 4 workers; ``RESULT tuning_speedup_4`` (printed for reference).

Each run's models get names of their own, so no run finds another's traced steps cached in the Python
workers; the run timed second was faster whichever mode it was, so the two modes alternate their order
over 2 rounds and each mode's fastest round counts; untimed warm-ups first (a fit, then a 2-configuration grid in each mode, 1 epoch) start the
workers, import TensorFlow and take every code path once: without them the first timed run took twice
as long, whichever it was. Run
``python benchmarks/bench_tuning.py [--quick] [--part a|b] [--parallel-first]`` (``--quick``: 5 epochs
instead of 20; ``--parallel-first`` times the parallel run first, to see the order's effect).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROWS, FEATURES = 2048, 16
RATES, WIDTHS = (0.01, 0.03, 0.1, 0.3), (8, 16)
CONF = {"spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false",
        "spark.python.worker.reuse": "true", "spark.driver.host": "127.0.0.1"}


def _data(spark):
    """2,048 rows of two noisy classes, ``fold`` 0/1 alternating (equal folds: full batches of 1,024)."""
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES))
    y = (x[:, :4].sum(axis=1) + 0.5 * rng.normal(size=ROWS) > 0).astype(int)
    rows = [(Vectors.dense(x[i]), float(y[i]), i % 2) for i in range(ROWS)]
    return spark.createDataFrame(rows, ["features", "label", "fold"]).repartition(4).cache()


def _model(width: int, run: str):
    import keras

    keras.utils.set_random_seed(width)
    model = keras.Sequential([keras.Input((FEATURES,), name="features"), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")], name=f"mlp{width}_{run}")
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    return model


def _grid_run(df, run: str, parallelism: int, workers, epochs: int, rates=RATES):
    """Time one CrossValidator over the grid; return (seconds, avgMetrics, stdMetrics)."""
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder

    from sparktf.ml import KerasEstimator

    estimator = KerasEstimator(batchSize=ROWS // 2, epochs=epochs, numWorkers=workers, trialParallelism=parallelism,
                               seed=0)
    grid = (ParamGridBuilder().addGrid(estimator.learningRate, list(rates))
            .addGrid(estimator.model, [_model(width, run) for width in WIDTHS]).build())
    validator = CrossValidator(estimator=estimator, estimatorParamMaps=grid, foldCol="fold", numFolds=2,
                               parallelism=parallelism, evaluator=MulticlassClassificationEvaluator(metricName="logLoss"))
    started = time.perf_counter()
    fitted = validator.fit(df)
    return time.perf_counter() - started, list(fitted.avgMetrics), list(fitted.stdMetrics)


def part(master: str, parallelism: int, epochs: int, parallel_first: bool = False, rounds: int = 2) -> dict:
    import sparktf
    from sparktf.ml import KerasEstimator

    spark = sparktf.init_spark(master, app_name="bench_tuning", conf=CONF)
    spark.sparkContext.setLogLevel("ERROR")
    slots = spark.sparkContext.defaultParallelism
    df = _data(spark)
    KerasEstimator(model=_model(8, "warm"), batchSize=256, numWorkers=slots).fit(df)  # workers up, TF imported
    for warm_parallelism, warm_workers in ((parallelism, None), (1, slots)):  # every code path once, untimed
        _grid_run(df, f"warm{warm_parallelism}", warm_parallelism, warm_workers, 1, RATES[:1])
    # the run timed second finds warmer Python workers (not its models: names differ): the modes alternate
    # their order over the rounds, and each mode's fastest round counts
    runs = {"serial": [], "parallel": []}
    for index in range(rounds):
        order = ["serial", "parallel"] if (index % 2 == 0) != parallel_first else ["parallel", "serial"]
        for mode in order:
            serial = mode == "serial"
            runs[mode].append(_grid_run(df, f"{mode}{index}", 1 if serial else parallelism, slots if serial else None,
                                        epochs))
    serial, parallel = (min(runs[mode], key=lambda run: run[0]) for mode in ("serial", "parallel"))
    spark.stop()
    return {"master": master, "slots": slots, "parallelism": parallelism, "serial": serial, "parallel": parallel,
            "rounds": {mode: [round(run[0], 1) for run in timed] for mode, timed in runs.items()}}


def _report(name: str, result: dict) -> float:
    serial_s, serial_avg, serial_std = result["serial"]
    parallel_s, parallel_avg, parallel_std = result["parallel"]
    print(f"{result['master']}: 8 configurations x 2 folds (+ the refit of the best); seconds per round "
          f"(orders alternating): {result['rounds']}, the fastest of each mode counts")
    print(f"  serial, each model on {result['slots']} workers:          {serial_s:7.1f} s")
    print(f"  parallelism={result['parallelism']}, each on "
          f"{max(1, result['slots'] // result['parallelism'])} worker(s):   {parallel_s:7.1f} s")
    for index, (a, b) in enumerate(zip(serial_avg, parallel_avg)):
        rate, width = RATES[index // len(WIDTHS)], WIDTHS[index % len(WIDTHS)]
        print(f"  lr={rate:<5} width={width:<3} mean log loss serial {a:.6f} parallel {b:.6f}")
    np.testing.assert_allclose(parallel_avg, serial_avg, atol=1e-5, err_msg="a trial's metric differs")
    np.testing.assert_allclose(parallel_std, serial_std, atol=1e-5, err_msg="a trial's fold metrics differ")
    print("  every configuration's metrics are equal between the runs (atol 1e-5)")
    speedup = serial_s / parallel_s
    print(f"RESULT {name}={speedup:.3f}")
    return speedup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 epochs per model instead of 20")
    parser.add_argument("--part", choices=["a", "b"], help="run one part (default: both, b first)")
    parser.add_argument("--parallel-first", action="store_true", help="time the parallel run before the serial one")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    epochs = 5 if args.quick else 20
    if args.child:
        master, parallelism = args.child.rsplit("|", 1)
        print("CHILD " + json.dumps(part(master, int(parallelism), epochs, args.parallel_first)), flush=True)
        return
    parts = {"b": ("local-cluster[4,1,1024]", 4, "tuning_speedup_4"), "a": ("local[2]", 2, "tuning_speedup")}
    for key in ("b", "a"):  # the main RESULT last
        if args.part not in (None, key):
            continue
        master, parallelism, name = parts[key]
        command = [sys.executable, os.path.abspath(__file__), "--child", f"{master}|{parallelism}"]
        command += (["--quick"] if args.quick else []) + (["--parallel-first"] if args.parallel_first else [])
        child = subprocess.run(command, capture_output=True, text=True)
        if child.returncode:
            sys.exit(f"{master} failed:\n" + "\n".join(child.stderr.splitlines()[-30:]))
        output = child.stdout
        result = json.loads(next(line for line in output.splitlines() if line.startswith("CHILD "))[6:])
        _report(name, result)


if __name__ == "__main__":
    main()
