"""sparktf in a Spark Connect session (``tests/programs/connect_program.py``, a client of its own).

A Connect client and a classic session do not share one process, so the
client runs in a subprocess; ``SPARK_REMOTE=local[2]`` starts its Connect
server.
"""

import json
import os
import subprocess
import sys

import pytest

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "connect_program.py")


@pytest.fixture(scope="module")
def results():
    """``{case: {key: value}}`` of the program's RESULT lines."""
    env = {name: value for name, value in os.environ.items() if name not in ("MASTER", "SPARK_MASTER")}
    proc = subprocess.run([sys.executable, PROGRAM], capture_output=True, text=True, env=env, timeout=300)
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            _, case, values = line.split(" ", 2)
            found[case] = json.loads(values)
    assert proc.returncode == 0 and "driver_host" in found, (proc.stdout[-3000:], proc.stderr[-6000:])
    return found


def test_init_spark_returns_a_connect_session_from_spark_remote(results):
    assert results["session"] == {"module": "pyspark.sql.connect.session", "again": True}


def test_run_starts_its_children_and_streams_their_lines_to_the_client(results):
    run = results["run"]
    assert run["value"] == {"rank": 0, "role": "worker 0", "tf_config_task": {"type": "worker", "index": 0}}
    assert run["lines"] == ["[worker 0] rank 0 of 2 says hi", "[worker 1] rank 1 of 2 says hi"]


def test_a_failing_child_and_too_many_workers_raise_sparktf_errors(results):
    failure = results["run_failure"]
    assert failure["error"] == "SparkTFError" and "planned failure in rank" in failure["message"]
    slots = results["slots"]
    assert slots["error"] == "SparkTFError" and "needs 3 tasks" in slots["message"] and "at most 2" in slots["message"]
    assert slots["seconds"] < 10


def test_entry_points_that_need_rdds_name_the_dataframe_alternative(results):
    rdd_only = results["rdd_only"]
    for entry in ("from_rdd", "from_string_rdd"):
        error, message = rdd_only[entry]
        assert error == "SparkTFError" and f"TFDataset.{entry}" in message and "from_dataframe" in message
    error, message = rdd_only["TFNet_distributed"]
    assert error == "SparkTFError" and "without distributed=True" in message
    assert rdd_only["TFNet_local"][0] == [[2.0, 2.0]] * 4
    for entry, (error, message) in results["not_yet"].items():
        assert error == "SparkTFError" and f"TFDataset.{entry}" in message and "docs/guides/connect.md" in message


def test_an_address_this_client_cannot_listen_on_fails_at_once_naming_the_setting(results):
    driver_host = results["driver_host"]
    assert driver_host["error"] == "SparkTFError" and "spark.sparktf.driverHost" in driver_host["message"]
    assert "192.0.2.1" in driver_host["message"] and driver_host["seconds"] < 5
