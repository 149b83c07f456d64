"""The cases that need a fresh driver process, run in order in one Python process with a Spark session of its own.

``python seed_scale.py CHECKPOINT_DIR`` prints the memory init_spark picks
(before any session exists), trains ResNet-101 on Spark's default 1g driver
heap, generates with a tiny GPT-2, its logging left as a new user's is
(nothing set up: the executors' log is this process's stderr), then kills the
driver JVM under a running ``optimize`` (last: it ends the session). Each
case prints one ``RESULT <case> ...`` line.
"""

import json
import os
import signal
import sys
import threading
import time

import numpy as np
from spark_conf import CONF  # beside this program

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tiny_lms

#: The last prompt is too long for 4 new tokens: its completion is null (on_error="null").
PROMPTS = ["a b", "ab c", "c a b", "b", "a a c b a", " ".join(["a"] * 14)]


def resnet101():
    """Train ResNet-101 on a new session with a 1g driver heap; return the session."""
    import keras

    import sparktf
    from sparktf import MaxIteration, SeveralIteration, TFDataset, TFOptimizer
    from sparktf.training.checkpoint import load_checkpoint

    spark = sparktf.init_spark("local[2]", conf=dict(CONF, **{"spark.driver.memory": "1g"}))
    model = keras.applications.ResNet101(weights=None, input_shape=(32, 32, 3), classes=10)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=32).astype("int32")
    before = [np.array(v) for v in model.weights]
    optimizer = TFOptimizer.from_keras(model, TFDataset.from_ndarrays((x, y), batch_size=8),
                                       model_dir=sys.argv[1])
    history = optimizer.optimize(MaxIteration(2), checkpoint_trigger=SeveralIteration(2))  # one segment
    changed = sum(not np.array_equal(a, np.array(v)) for a, v in zip(before, model.weights))
    driver = [np.array(v) for v in model.weights + model.optimizer.variables]
    state_mb = sum(a.nbytes for a in driver) / 2**20
    # the last checkpoint holds the state rank 0 streamed back (the driver checked rank 0's checksums of it)
    saved = load_checkpoint(os.path.join(sys.argv[1], "checkpoint-2.npz"))
    rank0 = saved.weights + saved.optimizer_variables
    equal = sum(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(driver, rank0))
    print(f"RESULT resnet101 iterations={history['iterations']} changed={changed} state_mb={state_mb:.0f} "
          f"variables={len(driver)} saved={len(rank0)} equal={equal} saved_iteration={saved.iteration}", flush=True)
    return spark


def generate(spark) -> None:
    """Batch generation on ``spark`` with no logging set up: the engine's figures reach the executors' log."""
    from sparktf import TFDataset, TFPredictor
    from tiny_lms import gpt2_lm

    frame = spark.createDataFrame([(prompt,) for prompt in PROMPTS], "prompt string").repartition(2)
    dataset = TFDataset.from_dataframe(frame, "prompt", batch_per_thread=2)
    completions = TFPredictor.from_keras(gpt2_lm(), dataset, method="generate", max_new_tokens=4,
                                         stop_token_ids=None, on_error="null").predict().collect()
    print("RESULT generate " + json.dumps(completions), flush=True)


def kill_jvm(spark) -> None:
    """Kill ``spark``'s driver JVM once a training job runs (no other stage is active before it)."""
    import keras

    from sparktf import DriverJVMGone, MaxIteration, TFDataset, TFOptimizer

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
    optimizer = TFOptimizer.from_keras(model, TFDataset.from_ndarrays((x, x[:, :1]), batch_size=16))
    jvm = spark.sparkContext._gateway.proc
    tracker = spark.sparkContext.statusTracker()
    killed_at = []

    def kill_when_training() -> None:
        deadline = time.monotonic() + 120
        while not tracker.getActiveStageIds() and time.monotonic() < deadline:
            time.sleep(0.05)
        killed_at.append(time.monotonic())
        os.kill(jvm.pid, signal.SIGKILL)

    threading.Thread(target=kill_when_training, daemon=True).start()
    try:
        optimizer.optimize(MaxIteration(10**7))
        print("RESULT kill_jvm error=none", flush=True)
    except DriverJVMGone as error:
        seconds = time.monotonic() - killed_at[0]
        print(f"RESULT kill_jvm error=DriverJVMGone seconds={seconds:.1f} message={error}", flush=True)


def driver_memory() -> None:
    from sparktf.context import _default_driver_memory

    chosen = _default_driver_memory({"spark.driver.memory": "3g"})
    print(f"RESULT driver_memory default={_default_driver_memory({})} chosen={chosen}", flush=True)


if __name__ == "__main__":
    driver_memory()
    session = resnet101()
    generate(session)
    kill_jvm(session)
