"""Seed-scale models and the driver JVM: each case runs in a fresh process with a session of its own."""

import os
import re
import subprocess
import sys


PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "seed_scale.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_program(*args, timeout):
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, PROGRAM, *args], capture_output=True, text=True, timeout=timeout, env=env)
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and results, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return results[-1]


def test_default_driver_memory_is_a_quarter_of_the_machine_within_bounds():
    result = run_program("driver_memory", timeout=60)
    default, chosen = re.match(r"RESULT default=(\d+)m chosen=(\S+)", result).groups()
    assert 2048 <= int(default) <= 8192 and chosen == "None"


def test_resnet101_with_momentum_trains_on_the_default_1g_driver_heap(tmp_path):
    result = run_program("resnet101", str(tmp_path / "ckpt"), timeout=540)
    fields = dict(item.split("=") for item in result.split()[1:])
    assert fields["iterations"] == "2"
    assert int(fields["changed"]) > 300  # the driver's model holds trained weights
    assert int(fields["state_mb"]) > 300  # weights + momentum: more than the JVM heap could carry twice
    # every weight and optimizer variable of the driver's model equals rank 0's final state
    assert fields["variables"] == fields["saved"] == fields["equal"] and int(fields["variables"]) > 600
    assert fields["saved_iteration"] == "2"
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["checkpoint-1.npz", "checkpoint-2.npz"]


def test_killing_the_driver_jvm_under_optimize_raises_a_clear_error():
    result = run_program("kill_jvm", timeout=180)
    assert "error=DriverJVMGone" in result, result
    seconds = float(re.search(r"seconds=([\d.]+)", result).group(1))
    assert seconds < 15
    assert "driver JVM died" in result
