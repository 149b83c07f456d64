"""Batch inference benchmark: TFPredictor vs Spark's predict_batch_udf vs one process.

The same Keras model, data, partitions and batch size for every method, run
side by side in one Spark session (``local[<cores>]``):

* ``tfpredictor_rdd``  ``TFPredictor.from_keras(model, dataset).predict().count()``;
* ``tfpredictor_df``   ``predict_dataframe`` written to Spark's ``noop`` sink;
* ``predict_batch_udf`` ``pyspark.ml.functions.predict_batch_udf`` with
  ``make_predict_fn`` loading the saved model and calling ``model.predict``
  as Spark's docs show, written to the ``noop`` sink;
* ``udf_on_batch``     the same UDF calling ``model.predict_on_batch`` (a
  faster variant than the docs', for reference);
* ``single_process``   ``model.predict`` on the whole array in a subprocess
  limited to one TensorFlow thread, the per-core bound (``x cores`` is the
  ideal for the cluster); ``single_all_threads`` is the same with TF's
  default threads.

Inputs are cached and every method is run once to warm up (model loads,
worker start) before the timed runs; the best of ``--repeats`` is reported.
Two workloads: an MLP on 64 floats per record and a small CNN on 32x32x3
images. The last line is ``RESULT predict_ratio_vs_udf=<TFPredictor RDD
records/s / predict_batch_udf records/s>`` for the MLP workload.

Run ``flock /tmp/sparktf-bench.lock python benchmarks/bench_predict.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict

import numpy as np

CORES = os.cpu_count() or 2
PARTITIONS = 2 * CORES
BATCH = 512


def build_model(kind: str):
    import keras

    keras.utils.set_random_seed(0)
    if kind == "mlp":
        return keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
             keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)]
        )
    return keras.Sequential(
        [keras.Input((32, 32, 3)), keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.MaxPooling2D(),
         keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
    )


def make_data(kind: str, records: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    shape = (records, 64) if kind == "mlp" else (records, 32, 32, 3)
    return rng.normal(size=shape).astype("float32")


def best_time(run: Callable[[], None], repeats: int) -> float:
    run()  # warm-up: worker start, model load, input cache
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def single_process_rate(model_path: str, data_path: str, threads: int) -> float:
    """records/s of model.predict in a fresh process (``threads=0``: TF's default)."""
    code = f"""
import time, numpy as np, tensorflow as tf, keras
if {threads}:
    tf.config.threading.set_intra_op_parallelism_threads({threads})
    tf.config.threading.set_inter_op_parallelism_threads({threads})
x = np.load({data_path!r}); model = keras.models.load_model({model_path!r})
model.predict(x[:{BATCH * 2}], batch_size={BATCH}, verbose=0)
start = time.perf_counter(); model.predict(x, batch_size={BATCH}, verbose=0)
print(len(x) / (time.perf_counter() - start))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def run_workload(spark, kind: str, records: int, repeats: int, workdir: str) -> Dict[str, float]:
    import pandas as pd
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    from sparktf import TFDataset, TFPredictor

    model = build_model(kind)
    x = make_data(kind, records)
    model_path = os.path.join(workdir, f"{kind}.keras")
    data_path = os.path.join(workdir, f"{kind}.npy")
    model.save(model_path)
    np.save(data_path, x)
    per_record = x.shape[1:]

    dataset = TFDataset.from_ndarrays(x, batch_per_thread=BATCH, num_partitions=PARTITIONS)
    predictor = TFPredictor.from_keras(model, dataset)
    flat = pd.DataFrame({"x": list(x.reshape(records, -1))})
    df = spark.createDataFrame(flat).repartition(PARTITIONS).cache()
    df.count()

    def docs_predict_fn():
        import keras as k

        loaded = k.models.load_model(model_path)

        def predict(inputs: np.ndarray) -> np.ndarray:
            return loaded.predict(inputs, verbose=0)

        return predict

    def on_batch_predict_fn():
        import keras as k

        loaded = k.models.load_model(model_path)
        return lambda inputs: loaded.predict_on_batch(inputs)

    def udf_run(make_fn):
        udf = predict_batch_udf(
            make_fn, return_type=ArrayType(FloatType()), batch_size=BATCH, input_tensor_shapes=[list(per_record)]
        )
        return lambda: df.select(udf("x").alias("p")).write.format("noop").mode("overwrite").save()

    def df_run():
        predictor.predict_dataframe(df, "x").write.format("noop").mode("overwrite").save()

    seconds = {
        "tfpredictor_rdd": best_time(lambda: predictor.predict().count(), repeats),
        "predict_batch_udf": best_time(udf_run(docs_predict_fn), repeats),
        "udf_on_batch": best_time(udf_run(on_batch_predict_fn), repeats),
    }
    if len(per_record) == 1:  # the images' DataFrame column is flat; predict_dataframe needs (32, 32, 3)
        seconds["tfpredictor_df"] = best_time(df_run, repeats)
    rates = {name: records / s for name, s in seconds.items()}
    rates["single_process"] = single_process_rate(model_path, data_path, threads=1)
    rates["single_all_threads"] = single_process_rate(model_path, data_path, threads=0)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer records and repeats")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    sizes = {"mlp": 20_000, "cnn": 4_000} if args.quick else {"mlp": 100_000, "cnn": 20_000}

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import sparktf

    spark = sparktf.init_spark(
        f"local[{CORES}]",
        app_name="bench_predict",
        conf={
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.python.worker.reuse": "true",
            "spark.driver.memory": "4g",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    print(f"cores={CORES} partitions={PARTITIONS} batch={BATCH} repeats={repeats}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_predict-") as workdir:
        for kind, records in sizes.items():
            rates = run_workload(spark, kind, records, repeats, workdir)
            results[kind] = rates
            bound = rates["single_process"] * CORES
            print(f"[{kind}] records={records}")
            for name, rate in rates.items():
                print(f"  {name:20s} {rate:12.0f} records/s")
            print(f"  ratio_vs_udf={rates['tfpredictor_rdd'] / rates['predict_batch_udf']:.2f} "
                  f"ratio_vs_udf_on_batch={rates['tfpredictor_rdd'] / rates['udf_on_batch']:.2f} "
                  f"ratio_vs_core_bound={rates['tfpredictor_rdd'] / bound:.2f}")
    spark.stop()
    mlp = results["mlp"]
    print(f"RESULT predict_ratio_vs_udf={mlp['tfpredictor_rdd'] / mlp['predict_batch_udf']:.2f}")


if __name__ == "__main__":
    main()
