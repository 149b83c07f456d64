"""Cases that need a fresh driver process: one process with a session of its own runs every case.

``tests/programs/seed_scale.py`` picks the default driver memory, trains
ResNet-101 on a 1g driver heap, generates with its logging left as a new
user's is, then kills its driver JVM under a running ``optimize``; each case
prints a ``RESULT <case> ...`` line.
"""

import json
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
def program(checkpoints):
    """The program's run (its stderr holds the executors' log)."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    # within pytest's own 600 s, so that a hung program is killed here rather than left behind
    return subprocess.run([sys.executable, PROGRAM, str(checkpoints)], capture_output=True, text=True, timeout=540,
                          env=env)


@pytest.fixture(scope="module")
def results(program):
    """Each case's RESULT line without ``RESULT <case> ``, by case."""
    lines = dict(line.split(" ", 2)[1:] for line in program.stdout.splitlines() if line.startswith("RESULT "))
    assert program.returncode == 0 and len(lines) == 4, \
        f"exit {program.returncode}\n{program.stdout[-3000:]}\n{program.stderr[-5000:]}"
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


def test_the_generation_figures_reach_the_executors_log_at_info_without_any_logging_set_up(results, program):
    completions = json.loads(results["generate"])
    assert len(completions) == 6 and sum(text is None for text in completions) == 1  # the too long prompt
    windows = re.findall(r"INFO sparktf.generate: generated (\d+) prompts \((\d+) null\), \d+ new tokens .*new "
                         r"tokens/s\); this worker so far: .*; 2 compiles on this worker", program.stderr)
    assert sum(int(prompts) for prompts, _ in windows) == 6 and sum(int(nulls) for _, nulls in windows) == 1, \
        program.stderr[-3000:]
    assert "WARNING sparktf.generate: generate: 1 of" in program.stderr  # the null row's reason, through the handler
