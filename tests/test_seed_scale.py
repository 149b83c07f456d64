"""Seed-scale models and the driver JVM: one fresh process with a session of its own runs every case.

``tests/programs/seed_scale.py`` picks the default driver memory, trains
ResNet-101 on a 1g driver heap, then kills its driver JVM under a running
``optimize``; each case prints a ``RESULT <case> ...`` line.
"""

import os
import re
import subprocess
import sys

import pytest

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "seed_scale.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The folder the ResNet-101 case checkpoints into."""
    return tmp_path_factory.mktemp("seed_scale") / "ckpt"


@pytest.fixture(scope="module")
def results(checkpoints):
    """Each case's RESULT line without ``RESULT <case> ``, by case."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    # within pytest's own 600 s, so that a hung program is killed here rather than left behind
    done = subprocess.run([sys.executable, PROGRAM, str(checkpoints)], capture_output=True, text=True, timeout=540,
                          env=env)
    lines = dict(line.split(" ", 2)[1:] for line in done.stdout.splitlines() if line.startswith("RESULT "))
    assert done.returncode == 0 and len(lines) == 3, \
        f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return lines


def test_default_driver_memory_is_a_quarter_of_the_machine_within_bounds(results):
    default, chosen = re.match(r"default=(\d+)m chosen=(\S+)", results["driver_memory"]).groups()
    assert 2048 <= int(default) <= 8192 and chosen == "None"


def test_resnet101_with_momentum_trains_on_the_default_1g_driver_heap(results, checkpoints):
    fields = dict(item.split("=") for item in results["resnet101"].split())
    assert fields["iterations"] == "2"
    assert int(fields["changed"]) > 300  # the driver's model holds trained weights
    assert int(fields["state_mb"]) > 300  # weights + momentum: more than the JVM heap could carry twice
    # every weight and optimizer variable of the driver's model equals rank 0's final state
    assert fields["variables"] == fields["saved"] == fields["equal"] and int(fields["variables"]) > 600
    assert fields["saved_iteration"] == "2"
    assert sorted(os.listdir(checkpoints)) == ["checkpoint-2.npz"]  # one segment, checkpointed at its end


def test_killing_the_driver_jvm_under_optimize_raises_a_clear_error(results):
    result = results["kill_jvm"]
    assert "error=DriverJVMGone" in result, result
    seconds = float(re.search(r"seconds=([\d.]+)", result).group(1))
    assert seconds < 15
    assert "driver JVM died" in result
