"""Each task's TensorFlow on its own Spark GPUs, and stage-level resource profiles (fake GPUs, on CPU).

``local[N]`` does not schedule task resources, so this runs a small
``local-cluster[1,2,1024]``: one executor with two cores and two fake GPUs
(a discovery script printing addresses 0 and 1) whose own
``CUDA_VISIBLE_DEVICES`` is ``5,7``, so address 0 must become device 5 and 1
device 7. Every stage asks for one GPU per task unless a ``resource_profile``
says otherwise. A custom layer records, from inside each task that builds the
model, the task's GPU addresses and the process's ``CUDA_VISIBLE_DEVICES``.
All of it runs in one driver process of its own.
"""

import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REMAPPED = {"0": "5", "1": "7"}

DRIVER = '''
import json, os, sys
import sparktf
import numpy as np
import keras
from sparktf import MaxIteration, TFDataset, TFOptimizer, TFPredictor
from sparktf.errors import SparkTFError
from sparktf.spark.sessions import session_kind
from sparktf.spark.session_state import session_state

script, RECORDS = sys.argv[1], sys.argv[2]
conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1", "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false", "spark.executor.memory": "512m",
        "spark.executorEnv.CUDA_VISIBLE_DEVICES": "5,7",
        # workers fork from a daemon that loaded TensorFlow (each job after the first runs in fresh workers)
        "spark.python.daemon.module": "sparktf.spark.tf_daemon"}
for scope, amount in (("worker", "2"), ("executor", "2"), ("driver", "2")):
    conf[f"spark.{scope}.resource.gpu.amount"] = amount
    conf[f"spark.{scope}.resource.gpu.discoveryScript"] = script
conf["spark.task.resource.gpu.amount"] = "1"
session = sparktf.init_spark("local-cluster[1,2,1024]", conf=conf)
session.sparkContext.setLogLevel("ERROR")


def report(args, ctx):
    print(f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')} ctx.gpus={','.join(ctx.gpus)}")
    return os.environ.get("CUDA_VISIBLE_DEVICES")


print("chief returned", sparktf.run(report, num_workers=2, timeout=120))


class RecordDevices(keras.layers.Layer):
    """Writes what the task that builds it sees (the driver builds it outside any task)."""

    def build(self, input_shape):
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None:
            gpu = context.resources().get("gpu")
            record = {"label": context.getLocalProperty("sparktf.test.label"), "stage": context.stageId(),
                      "pid": os.getpid(),
                      "task": list(gpu.addresses) if gpu else [], "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                      "growth": os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")}
            with open(os.path.join(RECORDS, f"{context.taskAttemptId()}.json"), "w") as out:
                json.dump(record, out)

    def call(self, inputs):
        return inputs


def model():
    inputs = keras.Input((4,))
    net = keras.Model(inputs, keras.layers.Dense(2)(RecordDevices()(inputs)))
    net.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return net


def stage(label, action):
    """Run ``action`` with the records of its tasks labelled (a local property of the jobs this thread starts: an
    executor environment variable would start a Python worker daemon of its own, TensorFlow imported again)."""
    session.sparkContext.setLocalProperty("sparktf.test.label", label)
    return action()


x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = (x[:, 0] > 0).astype("int32")
data = TFDataset.from_ndarrays((x, y), batch_size=16)
trainer = TFOptimizer.from_keras(model(), data, num_workers=2)
stage("train", lambda: trainer.optimize(MaxIteration(2), verbose=0))
stage("predict", lambda: TFPredictor.from_keras(model(), TFDataset.from_ndarrays(x, batch_per_thread=16)).predict().count())
frame = session.createDataFrame([(row.tolist(),) for row in x], ["features"])
scored = stage("predict_df_2gpus", lambda: TFPredictor.from_keras(model(), data).predict_dataframe(
    frame, "features", resource_profile={"gpus": 2}).count())
stage("predict_half", lambda: TFPredictor.from_keras(model(), data).predict_dataframe(
    frame, "features", resource_profile={"gpus": 0.5}).count())
two_gpus = TFOptimizer.from_keras(model(), data, num_workers=1, resource_profile={"gpus": 2})
planner, held = session_state(session_kind(session)).planner, []
watch = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: held.append(
    (planner.held(two_gpus.resource_profile), planner.held())))
stage("train_2gpus", lambda: two_gpus.optimize(MaxIteration(1), callbacks=[watch], verbose=0))
print("HELD:", held, planner.held(two_gpus.resource_profile))
try:
    TFOptimizer.from_keras(model(), data, num_workers=2, resource_profile={"gpus": 2}).optimize(MaxIteration(1))
except SparkTFError as error:
    print("SLOTS:", error)
session.stop()
'''


def test_each_task_runs_tensorflow_on_its_own_spark_gpus(tmp_path):
    script = tmp_path / "gpus.sh"
    script.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    script.chmod(0o755)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    records = tmp_path / "records"
    records.mkdir()
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    completed = subprocess.run([sys.executable, str(driver), str(script), str(records)], env=env, cwd=tmp_path,
                               capture_output=True, text=True, timeout=400)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-3000:]

    # sparktf.run: each child sees its own GPU, indexed into the executor's CUDA_VISIBLE_DEVICES
    devices = re.findall(r"\[worker (\d)\] CUDA_VISIBLE_DEVICES=(\S+) ctx\.gpus=(\S+)", output)
    assert sorted(device for _, device, _ in devices) == ["5", "7"], output[-3000:]
    assert all(device == REMAPPED[gpus] for _, device, gpus in devices)
    chief_device = dict((rank, device) for rank, device, _ in devices)["0"]
    assert f"chief returned {chief_device}" in output

    seen = [json.loads(path.read_text()) for path in records.glob("*.json")]
    by_label = collections.defaultdict(list)
    for record in seen:
        by_label[record["label"]].append(record)
        assert record["visible"] == ",".join(REMAPPED[address] for address in record["task"]), record
    for label in ("train", "predict"):
        # two tasks at once, one GPU each: disjoint addresses (the barrier stages run both tasks together)
        assert sorted(address for record in by_label[label] for address in record["task"]) == ["0", "1"], by_label
    # an executor with two GPUs ends a bound worker after its task: the next job runs in fresh workers
    assert not {r["pid"] for r in by_label["train"]} & {r["pid"] for r in by_label["predict"]}
    visible_per_process = collections.defaultdict(set)
    for record in seen:
        visible_per_process[record["pid"]].add(record["visible"])
    assert all(len(values) == 1 for values in visible_per_process.values()), visible_per_process
    # the profiles: both GPUs for one task (training and a DataFrame), half a GPU with memory growth
    for label in ("predict_df_2gpus", "train_2gpus"):
        assert by_label[label] and all(record["visible"] == "5,7" for record in by_label[label]), by_label[label]
    assert by_label["predict_half"] and all(r["growth"] == "true" and len(r["task"]) == 1
                                            for r in by_label["predict_half"])
    assert all(record["growth"] is None for label in ("train", "predict") for record in by_label[label])
    # slot planning: the call held its one slot under its profile, none of the defaults', and gave it back
    assert "HELD: [(1, 0)] 0" in output, output[-2000:]
    assert re.search(r"SLOTS: num_workers=2 .*\(of 1 in total, for resource profile \d+ \(task: [^)]*2 gpu", output), \
        output[-2000:]
