"""Cluster storage in drivers of their own (``tests/programs/storage_program.py``).

S3: a local S3 server (moto's server mode on 127.0.0.1) holds TFRecords,
checkpoints, summaries and a saved stage; the executors get its endpoint and
keys from ``spark.executorEnv.*``. Then the driver is killed with SIGKILL
while a checkpoint upload is in flight, and so is a driver writing
checkpoints to ``viewfs://``: each leaves a loadable latest checkpoint.
"""

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from sparktf.training.checkpoint import latest_checkpoint, load_checkpoint

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "storage_program.py")
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
KILL_DEADLINE_SECONDS = 240


def start_program(*args):
    """The program in a fresh Python, without AWS variables (its executors must get them from the session)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    return subprocess.Popen([sys.executable, PROGRAM, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)


def results_until_kill_ready(process):
    """``{case: {key: value}}`` of the RESULT lines up to ``RESULT kill_ready``; the output if it never comes."""
    results, output = {}, []
    for line in process.stdout:
        output.append(line)
        if line.startswith("RESULT "):
            case, *pairs = line.split()[1:]
            results[case] = dict(pair.split("=", 1) for pair in pairs)
            if case == "kill_ready":
                return results
    process.wait(timeout=60)
    pytest.fail("the program ended before its kill case:\n" + "".join(output[-40:]))


def iteration(name):
    """The iteration in a checkpoint's (or an in-progress checkpoint's) name."""
    return int(re.search(r"checkpoint-(\d+)\.npz", name).group(1))


def kill_when(process, condition):
    """SIGKILL ``process`` as soon as ``condition()`` holds (polled; bounded by KILL_DEADLINE_SECONDS)."""
    deadline = time.monotonic() + KILL_DEADLINE_SECONDS
    try:
        while process.poll() is None and time.monotonic() < deadline:
            seen = condition()
            if seen:
                process.kill()
                return seen
            time.sleep(0.01)
        pytest.fail(f"no checkpoint write in flight was seen (program exit code {process.poll()})")
    finally:
        process.kill()
        process.stdout.close()
        process.wait(timeout=60)


@pytest.fixture(scope="module")
def s3_proxy(s3_server):
    """The program's endpoint: the S3 server behind the test proxy, resetting nothing.

    It reset the 3rd-7th reads of one file of the cache=False case, meant to fall in the second epoch; but
    how often a streamed file is read in an epoch depends on the read-ahead's timing, the resets fell in
    the first epoch in one suite run in four, and training failed twice: left out until the resets follow
    the epochs instead of a read count."""
    from flaky_proxy import FlakyProxy

    with FlakyProxy(s3_server) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def s3_run(s3_server, s3_proxy):
    """The S3 program's results, and the upload it was killed under."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=s3_server, **{k.lower(): v for k, v in CREDENTIALS.items()
                                                       if k != "AWS_DEFAULT_REGION"}, region_name="us-east-1")
    process = start_program("s3", s3_proxy.url)
    results = results_until_kill_ready(process)

    def upload_in_flight():
        done = s3.list_objects_v2(Bucket="sparktf", Prefix="kill/").get("KeyCount", 0)
        uploads = s3.list_multipart_uploads(Bucket="sparktf", Prefix="kill/").get("Uploads", [])
        return done and [upload["Key"] for upload in uploads]

    in_flight = kill_when(process, upload_in_flight)
    return results, in_flight


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    for name, value in dict(CREDENTIALS, AWS_ENDPOINT_URL=s3_server).items():
        monkeypatch.setenv(name, value)


def test_s3_checkpoints_keep_the_newest_and_resume(s3_run):
    results, _ = s3_run
    assert results["train"]["iterations"] == "24"
    assert results["train"]["checkpoints"] == "checkpoint-16.npz,checkpoint-24.npz"
    assert results["resume"] == {"from": "24", "weights_equal": "True", "to": "32"}


def test_s3_summaries_are_uploaded_and_read_back(s3_run):
    results, _ = s3_run
    assert results["train"]["loss_rows"] == "24"
    assert int(results["train"]["event_files"]) >= 1


def test_s3_tfrecords_stream_and_stage_save_load(s3_run):
    results, _ = s3_run
    assert results["stream"]["iterations"] == "16" and results["stream"]["finite"] == "True"
    assert np.isfinite(float(results["stream"]["evaluated_loss"]))
    assert results["stage"]["weights_equal"] == "True"
    assert results["stage"]["files"] == "sparktf/stage/metadata/part-00000,sparktf/stage/model.keras"


def test_s3_driver_killed_mid_upload_leaves_a_loadable_latest_checkpoint(s3_run, s3_env):
    _, in_flight = s3_run
    latest = latest_checkpoint("s3a://sparktf/kill")
    assert latest is not None and iteration(latest) <= iteration(in_flight[0])  # the one in flight, if it finished
    state = load_checkpoint(latest)
    assert state.iteration == iteration(latest) and state.weights[0].shape == (4096, 8192)


def test_viewfs_driver_killed_mid_write_leaves_a_loadable_latest_checkpoint(tmp_path):
    folder = tmp_path / "mounted"
    folder.mkdir()
    process = start_program("viewfs", str(folder))
    results_until_kill_ready(process)
    kill_dir = folder / "kill"

    def write_in_flight():
        names = os.listdir(kill_dir) if kill_dir.is_dir() else []
        complete = [name for name in names if re.fullmatch(r"checkpoint-\d+\.npz", name)]
        return complete and [name for name in names if ".npz.tmp-" in name and not name.startswith(".")]

    in_flight = kill_when(process, write_in_flight)
    latest = latest_checkpoint(f"file://{kill_dir}")
    assert latest is not None and iteration(latest) <= iteration(in_flight[0])
    state = load_checkpoint(latest)
    assert state.iteration == iteration(latest) and state.weights[0].shape == (4096, 8192)
