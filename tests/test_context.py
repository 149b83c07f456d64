"""init_spark: one session, the right Python on executors, sparktf shipped to them."""

import json
import os
import subprocess
import sys

import sparktf
from sparktf.errors import CollectiveError, DataError, SparkTFError, TrainingError

HERE = os.path.dirname(os.path.abspath(__file__))

CLUSTER_SCRIPT = r"""
import json, os, sys
import sitecustomize
try:
    import sparktf
    raise SystemExit("the hidden-install fixture did not hide sparktf")
except ModuleNotFoundError:
    pass
sitecustomize.reveal_installed()
import sparktf

spark = sparktf.init_spark(
    "local-cluster[1,1,1024]",
    conf={"spark.driver.host": "127.0.0.1", "spark.ui.enabled": "false",
          "spark.executor.memory": "1g"},
)

def probe(_):
    import os, sys
    import tensorflow
    import sparktf
    return {
        "executable": sys.executable,
        "pid": os.getpid(),
        "sparktf_file": sparktf.__file__,
        "tf_version": tensorflow.__version__,
        "error_class": sparktf.DataError.__mro__[1].__name__,
    }

rows = spark.sparkContext.parallelize(range(2), 2).map(probe).collect()
import numpy as np
x = np.arange(40, dtype=np.float32).reshape(10, 4)
dataset = sparktf.TFDataset.from_ndarrays((x, np.arange(10)), num_partitions=2)  # broadcast to the executors
block_pids = dataset.block_rdd.map(lambda block: os.getpid()).collect()
print("RESULT_JSON " + json.dumps({
    "driver_executable": sys.executable,
    "pyspark_python": os.environ.get("PYSPARK_PYTHON"),
    "same_session": sparktf.init_spark() is spark,
    "rows": rows,
    "ndarray_records": [[f.tolist(), int(y)] for f, y in dataset.rdd.collect()],
    "block_pids_differ_from_driver": os.getpid() not in block_pids,
}))
spark.stop()
"""


def test_init_spark_returns_the_active_session(spark):
    assert sparktf.init_spark() is spark
    assert sparktf.init_spark(app_name="another-name") is spark


def test_init_spark_ships_the_package_once(spark):
    from sparktf.context import ship_package

    first = ship_package(spark)
    assert first.endswith("sparktf.zip")
    assert ship_package(spark) == first


STOP_SCRIPT = r"""
import json, os, socket, sys, threading
import sparktf
from sparktf.spark.session_state import failure_inbox
from sparktf.spark.sessions import session_kind

def tensorflow_in_worker(session):  # has the Python worker that runs the next task imported TensorFlow?
    for thread in threading.enumerate():
        if thread.name == "sparktf-warm-up":
            thread.join(timeout=120)
    return session.sparkContext.parallelize([0], 1).map(lambda _: "tensorflow" in sys.modules).collect()[0]

conf = {"spark.driver.host": "127.0.0.1", "spark.ui.enabled": "false"}
spark = sparktf.init_spark("local[1]", conf=conf)
warm = tensorflow_in_worker(spark)
folder = os.path.dirname(sparktf.context.ship_package(spark))
existed = os.path.isdir(folder)
inbox = failure_inbox(session_kind(spark)).address
spark.stop()
again = sparktf.init_spark("local[1]", conf=dict(conf, **{"spark.sparktf.warmUpWorkers": "false"}))
try:
    socket.create_connection((inbox.split(":")[0], int(inbox.split(":")[1])), timeout=5).close()
    inbox_open = True
except OSError:
    inbox_open = False
print("RESULT_JSON " + json.dumps({
    "inbox_open_after_stop": inbox_open,
    "warm": warm,
    "warm_when_turned_off": tensorflow_in_worker(again),
    "existed": existed,
    "exists_after_stop": os.path.exists(folder),
    "left_at_exit": os.path.dirname(sparktf.context.ship_package(again)),
}))
"""


def test_new_sessions_warm_their_python_workers_and_a_stopped_sessions_folder_and_inbox_are_released(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", STOP_SCRIPT], cwd=str(tmp_path), capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.path.dirname(HERE), "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT_JSON ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT_JSON "):])
    assert result["warm"] is True and result["warm_when_turned_off"] is False  # TensorFlow imported in the background
    assert result["existed"] is True and result["exists_after_stop"] is False
    assert result["inbox_open_after_stop"] is False  # the stopped session's failure inbox was closed
    assert os.path.basename(result["left_at_exit"]).startswith("sparktf-pyfiles-")
    assert not os.path.exists(result["left_at_exit"])  # the second session was never stopped: removed at exit
    # the warm-up imported TensorFlow in a Python worker after sparktf: none of TensorFlow's start-up lines
    assert "absl::InitializeLog" not in proc.stderr and "cpu_feature_guard" not in proc.stderr, proc.stderr[-3000:]
    if not os.path.exists("/proc/driver/nvidia"):
        assert "cuInit" not in proc.stderr, proc.stderr[-3000:]


def test_error_hierarchy():
    assert issubclass(DataError, SparkTFError) and issubclass(DataError, ValueError)
    assert issubclass(TrainingError, SparkTFError) and issubclass(TrainingError, RuntimeError)
    assert issubclass(CollectiveError, TrainingError)


def test_executors_without_sparktf_get_python_and_package_from_init_spark(tmp_path):
    """An executor process of its own that lacks sparktf imports it from the shipped zip."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    env["PYTHONPATH"] = os.path.join(HERE, "hidden_install_site")
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    script = tmp_path / "cluster_job.py"
    script.write_text(CLUSTER_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=str(tmp_path),
        capture_output=True, text=True, timeout=300,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT_JSON ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT_JSON "):])
    assert result["pyspark_python"] == result["driver_executable"]
    assert result["same_session"] is True
    assert len(result["rows"]) == 2
    for row in result["rows"]:
        assert row["executable"] == result["driver_executable"]
        assert "sparktf.zip" in row["sparktf_file"]
        assert row["error_class"] == "SparkTFError"
        assert row["tf_version"]
    # from_ndarrays' partitions travel to separate executor processes in broadcast variables, cached as raw frames
    assert result["ndarray_records"] == [[[4.0 * i + j for j in range(4)], i] for i in range(10)]
    assert result["block_pids_differ_from_driver"] is True


def test_import_without_tensorflow_names_the_extra_to_install():
    hide_tensorflow = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda name, *a: None if name == 'tensorflow' else real(name, *a)\n"
        "try:\n"
        "    import sparktf\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    proc = subprocess.run([sys.executable, "-c", hide_tensorflow], capture_output=True, text=True, timeout=60)
    assert "pip install tensorflow," in proc.stdout, proc.stdout + proc.stderr
    assert "sparktf[gpu]" in proc.stdout
