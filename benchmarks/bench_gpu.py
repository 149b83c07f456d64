"""GPU training benchmark: ResNet-50 (224x224x3, global batch 64, mixed precision) through TFOptimizer vs Keras ``fit``.

Side by side in one invocation, each case in a fresh subprocess of its own
(no shared Spark session, TensorFlow runtime or GPU memory), on the same
synthetic data (random images and labels made in-process, nothing
downloaded), model (``keras.applications.ResNet50``, 1000 classes, SGD with
momentum) and ``--policy`` (a ``keras.mixed_precision`` global policy):

* ``keras_fit``: ``model.fit`` on the GPU with Keras' defaults (on a GPU that
  includes XLA: ``jit_compile="auto"``), an untimed warm-up ``fit`` that
  traces and compiles, then a timed ``fit`` of ``--iterations`` steps;
* ``sparktf_1w``: ``TFOptimizer.from_keras(..., num_workers=1)`` on
  ``local-cluster[1,C,M]`` with Spark GPU scheduling: a discovery script
  (this file with ``--discover``) lists the GPUs ``nvidia-smi`` sees, the
  worker and executor hold 1, the single barrier task asks for it
  (``spark.task.resource.gpu.amount=1``) and all C cores
  (``spark.task.cpus``, TensorFlow's thread pools in the task); an untimed
  warm-up ``optimize`` starts the Python worker and traces, then a timed
  ``optimize`` of ``--iterations`` iterations (job launch, state fetch and
  upload included, as a user gets them);
* ``sparktf_2w_shared``: the same with two barrier tasks sharing the GPU
  (``spark.task.resource.gpu.amount=0.5``, C/2 cores each,
  ``TF_FORCE_GPU_ALLOW_GROWTH=true`` so that neither TensorFlow takes the
  whole GPU's memory), global batch 64 (32 each), gradients summed over the
  host ring; the all-reduce's share of rank 0's step time comes from the
  segment's phase timings (``TFOptimizer.last_timings``).

The Spark drivers hide the GPU from their own TensorFlow: they only build
the model, and a driver on the GPU would take its memory from the task. On a
machine with several GPUs run under ``CUDA_VISIBLE_DEVICES=<one index>``:
every process then sees that one GPU.

Printed: a table of images/s per case (end to end, and over the training
steps alone), where rank 0's time went, the seed table's figures for
reference (ResNet-101, not this model: 78 images/s on one P40, 204 on
four), then ``RESULT shared_gpu_ratio=<sparktf_2w_shared / keras_fit>``,
``RESULT shared_allreduce_share=<all-reduce seconds / step seconds>`` and,
last, ``RESULT gpu_ratio=<sparktf_1w images/s / keras_fit images/s>`` (the
goal is >= 0.9).

Run on a GPU machine::

    flock /tmp/sparktf-bench.lock python benchmarks/bench_gpu.py [--policy mixed_float16]

Without a GPU it exits with a message and status 1. ``--smoke`` (also
``--quick``, which ``make bench`` passes) runs every case end to end on CPU
against a fake GPU (a discovery script with a fixed address), 32x32 images,
float32 and a few iterations: the same table and RESULT lines, values
meaningless.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_train import format_timings  # noqa: E402

CASES = {"keras_fit": 1, "sparktf_1w": 1, "sparktf_2w_shared": 2}  # case -> barrier tasks on the one GPU
RECORDS = 512
CLASSES = 1000
FAKE_GPU_ADDRESSES = ["0"]
SEED_TABLE = "ResNet-101 at 78 images/s on one P40, 204 on four"
STEP_PHASES = ("data", "compute", "exchange", "apply")
SMOKE = {"image_size": 32, "iterations": 2, "warm_up": 1, "policy": "float32", "executor_memory": 1024}
FULL = {"image_size": 224, "iterations": 500, "warm_up": 10, "policy": "mixed_float16", "executor_memory": 16384}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", "--quick", action="store_true",
                        help="CPU run against a fake GPU, tiny images, a few iterations (values meaningless)")
    parser.add_argument("--policy", choices=("mixed_float16", "mixed_bfloat16", "float32"),
                        help="Keras global dtype policy (default mixed_float16; float32 with --smoke)")
    parser.add_argument("--image-size", type=int, help="image height and width (default 224; 32 with --smoke)")
    parser.add_argument("--batch", type=int, default=64, help="global batch (default 64)")
    parser.add_argument("--iterations", type=int, help="timed iterations per case (default 500; 2 with --smoke)")
    parser.add_argument("--warm-up", type=int, help="untimed iterations first (default 10; 1 with --smoke)")
    parser.add_argument("--cores", type=int, default=os.cpu_count(),
                        help="cores of the local-cluster executor (default: this machine's)")
    parser.add_argument("--executor-memory", type=int,
                        help="MB of executor memory (default 16384; 1024 with --smoke)")
    parser.add_argument("--case", choices=tuple(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--discover", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name, default in (SMOKE if args.smoke else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.batch % 2 or args.cores < 2:
        parser.error("--batch must be even and --cores at least 2 (two workers share them in sparktf_2w_shared)")
    return args


def nvidia_gpus() -> List[str]:
    """The indices of the GPUs ``nvidia-smi`` lists (empty without it or without GPUs)."""
    if shutil.which("nvidia-smi") is None:
        return []
    listed = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                            capture_output=True, text=True)
    return listed.stdout.split() if listed.returncode == 0 else []


def write_discovery_script(directory: str, smoke: bool) -> str:
    """A Spark GPU discovery script: this file with ``--discover`` (fake addresses with ``--smoke``)."""
    path = os.path.join(directory, "discover_gpus.sh")
    command = [sys.executable, os.path.abspath(__file__), "--discover"] + (["--smoke"] if smoke else [])
    with open(path, "w") as script:
        script.write(f"#!/bin/sh\nexec {shlex.join(command)}\n")
    os.chmod(path, 0o755)
    return path


def build_model(args: argparse.Namespace):
    import keras

    keras.mixed_precision.set_global_policy(args.policy)
    keras.utils.set_random_seed(0)
    size = args.image_size
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=CLASSES)
    model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "sparse_categorical_crossentropy")
    return model


def make_data(args: argparse.Namespace):
    rng = np.random.default_rng(0)
    images = rng.random((RECORDS, args.image_size, args.image_size, 3), dtype=np.float32)
    return images, rng.integers(0, CLASSES, RECORDS).astype(np.int32)


def keras_fit(args: argparse.Namespace) -> Dict:
    """``keras_fit``: seconds of ``model.fit`` over ``args.iterations`` batches, after a warm-up ``fit``."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus and not args.smoke:
        sys.exit("bench_gpu.py: TensorFlow sees no GPU (a CUDA build of TensorFlow and its libraries are needed)")
    model = build_model(args)
    data = tf.data.Dataset.from_tensor_slices(make_data(args)).batch(args.batch, drop_remainder=True)
    data = data.repeat().prefetch(tf.data.AUTOTUNE)
    model.fit(data, steps_per_epoch=args.warm_up, epochs=1, verbose=0)
    started = time.perf_counter()
    model.fit(data, steps_per_epoch=args.iterations, epochs=1, verbose=0)
    seconds = time.perf_counter() - started
    device = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else "CPU"
    return {"seconds": seconds, "device": device, "jit_compile": bool(model.jit_compile)}


def sparktf_case(args: argparse.Namespace, workers: int) -> Dict:
    """``sparktf_1w`` / ``sparktf_2w_shared``: seconds of a timed ``optimize`` and rank 0's phase timings."""
    import tensorflow as tf

    tf.config.set_visible_devices([], "GPU")  # the driver only builds the model: the GPU is the task's
    import sparktf
    from sparktf import MaxIteration, TFDataset, TFOptimizer

    with tempfile.TemporaryDirectory() as directory:
        conf = gpu_session_conf(args, workers, write_discovery_script(directory, args.smoke))
        session = sparktf.init_spark(f"local-cluster[1,{args.cores},{args.executor_memory}]",
                                     app_name="bench-gpu", conf=conf)
        session.sparkContext.setLogLevel("ERROR")
        dataset = TFDataset.from_ndarrays(make_data(args), batch_size=args.batch, num_partitions=workers)
        dataset.num_records  # counted once, outside the timing
        optimizer = TFOptimizer.from_keras(build_model(args), dataset, num_workers=workers)
        optimizer.optimize(MaxIteration(args.warm_up), verbose=0)  # the Python workers start, the step traces
        end = args.warm_up + args.iterations
        started = time.perf_counter()
        history = optimizer.optimize(MaxIteration(end), verbose=0)
        seconds = time.perf_counter() - started
        session.stop()
    assert history["iterations"] == end, history["iterations"]
    return {"seconds": seconds, "timings": optimizer.last_timings}


def gpu_session_conf(args: argparse.Namespace, workers: int, discovery_script: str) -> Dict[str, str]:
    """Spark settings: one executor holding one GPU, ``workers`` tasks sharing it and the executor's cores."""
    from sparktf.context import WARM_UP_CONF

    conf = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.executor.memory": f"{args.executor_memory}m",
        "spark.task.cpus": str(args.cores // workers),
        "spark.task.resource.gpu.amount": f"{1 / workers:g}",
        WARM_UP_CONF: "false",  # the untimed warm-up optimize starts the workers
    }
    for scope in ("worker", "executor"):
        conf[f"spark.{scope}.resource.gpu.amount"] = "1"
        conf[f"spark.{scope}.resource.gpu.discoveryScript"] = discovery_script
    if workers > 1:
        conf["spark.executorEnv.TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    return conf


def run_case(case: str) -> Dict:
    """Run ``case`` in a fresh subprocess with this invocation's flags; its JSON result (exits if it failed)."""
    completed = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--case", case],
                               capture_output=True, text=True)
    if completed.returncode != 0:
        sys.stderr.write(completed.stderr[-5000:])
        sys.exit(f"bench_gpu.py: {case} failed (exit status {completed.returncode})")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def report(args: argparse.Namespace, results: Dict[str, Dict]) -> None:
    """The table, where rank 0's time went, the seed table's figures and the RESULT lines (gpu_ratio last)."""
    fit = results["keras_fit"]
    images = args.iterations * args.batch
    rates = {case: images / result["seconds"] for case, result in results.items()}
    mode = "SMOKE (CPU, fake GPU: values meaningless)" if args.smoke else f"on {fit['device']}"
    print(f"ResNet-50 {args.image_size}x{args.image_size}x3, global batch {args.batch}, policy {args.policy}, "
          f"{args.iterations} timed iterations after {args.warm_up} warm-up, {mode}; Spark "
          f"local-cluster[1,{args.cores},{args.executor_memory}]; keras_fit jit_compile={fit['jit_compile']}")
    print(f"{'case':18s} {'tasks':>5s} {'seconds':>8s} {'images/s':>9s} {'steps only':>10s} {'allreduce share':>15s}")
    shares = {}
    for case, result in results.items():
        steps, share = "-", "-"
        if "timings" in result:
            step_seconds = sum(result["timings"][phase] for phase in STEP_PHASES)
            shares[case] = result["timings"]["exchange"] / step_seconds
            steps, share = f"{images / step_seconds:.1f}", f"{shares[case]:.3f}"
        print(f"{case:18s} {CASES[case]:5d} {result['seconds']:8.2f} {rates[case]:9.1f} {steps:>10s} {share:>15s}")
    for case, result in results.items():
        if "timings" in result:
            print(f"{case} where the time went (rank 0): {format_timings(result['timings'], args.iterations)}")
    print(f"reference only, the seed table (another model and GPU): {SEED_TABLE}")
    print(f"RESULT shared_gpu_ratio={rates['sparktf_2w_shared'] / rates['keras_fit']:.3f}")
    print(f"RESULT shared_allreduce_share={shares['sparktf_2w_shared']:.3f}")
    print(f"RESULT gpu_ratio={rates['sparktf_1w'] / rates['keras_fit']:.3f}")


def main() -> None:
    args = parse_args()
    if args.discover:  # Spark's discovery script: the resource's addresses as JSON
        print(json.dumps({"name": "gpu", "addresses": FAKE_GPU_ADDRESSES if args.smoke else nvidia_gpus()}))
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.case == "keras_fit":
        print(json.dumps(keras_fit(args)))
        return
    if args.case:
        print(json.dumps(sparktf_case(args, CASES[args.case])))
        return
    if not args.smoke and not nvidia_gpus():
        sys.exit("bench_gpu.py needs a GPU: nvidia-smi is missing or lists none. "
                 "Run it with --smoke for a CPU check against a fake GPU.")
    report(args, {case: run_case(case) for case in CASES})


if __name__ == "__main__":
    main()
