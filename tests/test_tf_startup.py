"""sparktf.tf_startup drops TensorFlow's start-up lines and nothing else."""

import os
import shutil
import subprocess
import sys

from sparktf.tf_startup import StartupLineFilter, _filtered_stderr

# As TensorFlow 2.21 writes them on a machine without a GPU (absl's prefix: level, date, time, thread).
STARTUP = [
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
    b"I0000 00:00:1795503853.305627   15556 port.cc:153] oneDNN custom operations are on. You may see slightly "
    b"different numerical results due to floating-point round-off errors from different computation orders. "
    b"To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.\n",
    b"I0000 00:00:1795503853.305959   15556 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
    b"GPU will not be used.\n",
    b"I0000 00:00:1795503853.350561   15556 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    b"available CPU instructions in performance-critical operations.\n",
    b"To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the "
    b"appropriate compiler flags.\n",
]
CUINIT = (b"E0000 00:00:1795503856.166490   15556 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
          b"Failed call to cuInit: UNKNOWN ERROR (303)\n")
KEPT = [
    b"E0000 00:00:1795503856.166490   15556 op_kernel.cc:1857] OP_REQUIRES failed at conv_ops.cc:12 : INVALID\n",
    b"WARNING:sparktf:the training job was cancelled\n",
    b"Traceback (most recent call last):\n",
    b"W0000 00:00:1795503856.1   15556 port.cc:153] a warning from port.cc about something else\n",
]


def test_the_start_up_lines_are_dropped_and_other_lines_kept():
    keep = StartupLineFilter(has_nvidia_driver=True).keep
    assert not any(keep(line) for line in STARTUP)
    assert all(keep(line) for line in KEPT)


def test_the_cuinit_error_is_dropped_only_without_an_nvidia_driver():
    assert not StartupLineFilter(has_nvidia_driver=False).keep(CUINIT)
    assert StartupLineFilter(has_nvidia_driver=True).keep(CUINIT)
    seen_stub = StartupLineFilter(has_nvidia_driver=True)
    assert not seen_stub.keep(STARTUP[2])  # "Could not find cuda drivers": no driver after all
    assert not seen_stub.keep(CUINIT)


def test_standard_error_is_filtered_inside_the_block_only(capfd):
    with _filtered_stderr():
        for line in STARTUP + KEPT:
            os.write(2, line)
        os.write(2, b"an unfinished line")
    os.write(2, STARTUP[0])
    assert capfd.readouterr().err.encode() == b"".join(KEPT) + b"an unfinished line" + STARTUP[0]


def test_the_worker_daemon_preloads_tensorflow_without_its_start_up_lines_or_a_runtime():
    # and a load after the preload (a forked worker's first) only freezes its own objects: the preload's full
    # collection counts as the last one (none of its objects are walked again)
    code = ("import sys; from sparktf.spark import tf_daemon; tf_daemon.preload(); "
            "from tensorflow.python.eager import context; c = context.context_safe(); "
            "from sparktf.process_state import process_cache; from sparktf.spark import worker_gc; "
            "worker_gc.frozen_after(lambda: [[] for _ in range(100)])(); "
            "since = process_cache('frozen_since', worker_gc.FrozenSince); "
            "print(c is None or not c._initialized, 'keras' in sys.modules, since.objects > 100_000, since.added > 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.split() == [b"True"] * 4
    keep = StartupLineFilter(has_nvidia_driver=False).keep  # drops exactly TensorFlow's start-up lines
    assert all(keep(line) for line in done.stderr.splitlines()), done.stderr.decode()


def test_the_shared_sessions_python_workers_fork_from_the_preloading_daemon(sc):
    # and their pyspark is the installed package's compiled copy, not the same files compiled from Spark's zip
    def daemon_of_this_worker(_):
        import os

        import pyspark

        parent = os.getppid()
        with open(f"/proc/{parent}/cmdline", "rb") as cmdline, open(f"/proc/{parent}/maps") as maps:
            yield (b"sparktf.spark.tf_daemon" in cmdline.read().split(b"\0"), "_pywrap_tensorflow_internal" in maps.read(),
                   pyspark.__file__)

    import pyspark

    assert sc.parallelize([0], 1).mapPartitions(daemon_of_this_worker).collect() == [(True, True, pyspark.__file__)]


def test_the_daemon_keeps_the_zip_of_another_spark_first(tmp_path):
    import pyspark

    other_spark = tmp_path / "spark" / "python" / "lib"
    other_spark.mkdir(parents=True)
    shutil.copy(os.path.join(os.path.dirname(pyspark.__file__), "python", "lib", "pyspark.zip"), other_spark)
    code = ("from sparktf.spark import tf_daemon; moved = tf_daemon.prefer_installed_pyspark(); "
            "import pyspark; print(moved, pyspark.__file__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(other_spark / "pyspark.zip")})
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split() == ["False", str(other_spark / "pyspark.zip" / "pyspark" / "__init__.py")]
