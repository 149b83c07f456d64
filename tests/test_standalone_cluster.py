"""``spark-submit examples/resnet_cifar.py --smoke`` on a real Spark standalone cluster: a master and two
one-core workers started from the pip-installed pyspark, all on 127.0.0.1, stopped afterwards."""

import json
import os
import signal
import re
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack

import pyspark
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPARK_BIN = os.path.join(os.path.dirname(pyspark.__file__), "bin")
HOST = "127.0.0.1"

pytestmark = pytest.mark.cluster


def log_tail(path, characters: int = 3000) -> str:
    with open(path, errors="replace") as handle:
        return handle.read()[-characters:]


class ProcessGroups:
    """Processes started in their own process groups; ``stop`` ends each group and checks it is gone."""

    def __init__(self) -> None:
        self.groups = []

    def start(self, argv, log_path, env) -> subprocess.Popen:
        with open(log_path, "w") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)
        self.groups.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.groups):
            for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
                if not group_alive(process.pid):
                    break
                os.killpg(process.pid, sig)
                deadline = time.monotonic() + grace
                while group_alive(process.pid) and time.monotonic() < deadline:
                    process.poll()
                    time.sleep(0.2)
            process.wait(timeout=10)
        still_running = [process.pid for process in self.groups if group_alive(process.pid)]
        assert not still_running, f"process groups still running after SIGKILL: {still_running}"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def logged_value(path, pattern: str, process: subprocess.Popen, timeout: float) -> str:
    """The first group of ``pattern`` once it appears in the log at ``path`` (the process must stay up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{path.name}: the process exited:\n{log_tail(path)}"
        match = re.search(pattern, path.read_text(errors="replace"))
        if match:
            return match.group(1)
        time.sleep(0.2)
    pytest.fail(f"{pattern!r} did not appear in {path} within {timeout} s:\n{log_tail(path)}")


def wait_for_alive_workers(master_ui: str, expected: int, master: subprocess.Popen, logs, timeout: float) -> None:
    """Poll the master's JSON status until ``expected`` workers are ALIVE (or fail after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    status = None
    while time.monotonic() < deadline:
        assert master.poll() is None, f"the Spark master exited:\n{log_tail(logs[0])}"
        try:
            with urllib.request.urlopen(f"{master_ui}/json/", timeout=2) as response:
                status = json.load(response)
            if sum(worker["state"] == "ALIVE" for worker in status.get("workers", [])) >= expected:
                return
        except OSError:
            pass  # the master's web UI is not up yet
        time.sleep(0.5)
    tails = "\n".join(f"--- {path}\n{log_tail(path)}" for path in logs)
    pytest.fail(f"{expected} ALIVE workers not registered within {timeout} s; last status {status}\n{tails}")


def test_spark_submit_resnet_cifar_smoke_on_a_standalone_cluster(tmp_path):
    env = dict(os.environ, SPARK_LOCAL_IP=HOST, SPARK_WORKER_DIR=str(tmp_path / "work"),
               SPARK_LOG_DIR=str(tmp_path / "logs"), PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    env.pop("MASTER", None)
    spark_class = os.path.join(SPARK_BIN, "spark-class")
    model_dir = tmp_path / "model"
    processes = ProcessGroups()
    with ExitStack() as cleanup:
        cleanup.callback(processes.stop)
        logs = [tmp_path / "master.log"]
        # port 0: the master and its web UI take free ports themselves (no race with other processes)
        master = processes.start([spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST,
                                  "--port", "0", "--webui-port", "0"], logs[0], env)
        master_url = logged_value(logs[0], r"Starting Spark master at (spark://\S+)", master, timeout=90)
        master_ui = logged_value(logs[0], r"Bound MasterWebUI to \S+, and started at (http://\S+)", master, 90)
        for index in range(2):
            logs.append(tmp_path / f"worker{index}.log")
            processes.start([spark_class, "org.apache.spark.deploy.worker.Worker", "--host", HOST,
                             "--cores", "1", "--memory", "2g", "--webui-port", "0", master_url],
                            logs[-1], env)
        wait_for_alive_workers(master_ui, 2, master, logs, timeout=90)

        submit = subprocess.run(
            [os.path.join(SPARK_BIN, "spark-submit"), "--master", master_url,
             "--conf", f"spark.pyspark.python={sys.executable}",
             "--conf", f"spark.pyspark.driver.python={sys.executable}",
             "--conf", f"spark.driver.host={HOST}", "--conf", f"spark.driver.bindAddress={HOST}",
             "--conf", "spark.ui.enabled=false",
             # training needs both task slots: start only when both executors have registered
             "--conf", "spark.cores.max=2", "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",
             "--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=120s",
             os.path.join(ROOT, "examples", "resnet_cifar.py"), "--smoke", "--model_dir", str(model_dir)],
            env=env, capture_output=True, text=True, timeout=420, start_new_session=True)
        output = submit.stdout + submit.stderr
        assert submit.returncode == 0, f"spark-submit failed ({submit.returncode}):\n{output[-6000:]}"
        assert "ResNet-20 on 80 images, 2 workers, global batch 16, 1 epochs" in submit.stdout
        accuracy_lines = [line for line in submit.stdout.splitlines() if line.startswith("accuracy=")]
        assert len(accuracy_lines) == 1, submit.stdout[-3000:]
        assert 0.0 <= float(accuracy_lines[0].split()[0].split("=")[1]) <= 1.0
        assert (model_dir / "checkpoint-5.npz").is_file(), sorted(os.listdir(model_dir))
        executor_logs = list((tmp_path / "work").glob("app-*/*/stderr"))
        assert len(executor_logs) == 2, "the application should have run one executor on each worker"
