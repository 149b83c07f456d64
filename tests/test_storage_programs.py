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


class SecondEpochReads:
    """A proxy rule: reset the second epoch's reads of one chunk of ``key`` until the relaunched task reads on.

    Armed by the request ``marker`` (the program's records are counted). The
    chunk is the fifth: a reader opened early stops after ``AHEAD_CHUNKS + 1``
    chunks until its pass is read, so whatever the read-ahead's timing, the
    fifth chunk of a file is read once per pass and in pass order (the first
    epoch's read passes). The relaunch reads the fourth chunk (which no early
    reader reaches either) again before the fifth: from then on, nothing is
    reset. However many times s3fs retries, so, the second epoch fails once.
    """

    def __init__(self, key: bytes, marker: bytes):
        from sparktf.data.tfrecord_readahead import AHEAD_CHUNKS, CHUNK_BYTES

        chunk = AHEAD_CHUNKS + 2
        self.get, self.marker = b"GET " + key + b" ", marker
        self.fifth, self.fourth = (b"bytes=%d-" % (index * CHUNK_BYTES) for index in (chunk, chunk - 1))
        self.armed, self.fifth_reads, self.relaunched = False, 0, False

    def __call__(self, chunk: bytes) -> bool:
        self.armed = self.armed or chunk.startswith(self.marker)
        if not self.armed or self.relaunched or not chunk.startswith(self.get):
            return False
        if self.fifth in chunk:
            self.fifth_reads += 1
            return self.fifth_reads > 1
        self.relaunched = self.fourth in chunk and self.fifth_reads > 1
        return False


@pytest.fixture(scope="module")
def s3_proxy(s3_server):
    """The program's endpoint: the S3 server behind a proxy that resets the reads of one file in the second epoch
    of its cache=False case (:class:`SecondEpochReads`)."""
    from flaky_proxy import FlakyProxy

    with FlakyProxy(s3_server) as proxy:
        proxy.reset_when = SecondEpochReads(b"/sparktf/stream/train-1.tfrecord", b"PUT /sparktf/stream-counted ")
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


def test_s3_tfrecord_reads_the_store_breaks_off_are_relaunched_to_the_exact_iteration(s3_run, s3_proxy):
    """The second epoch's reads of one file reset (cache=False): a task failure, relaunched once and named in the
    driver's warning; the run ends at its exact iteration with one loss per iteration."""
    results, _ = s3_run
    rule = s3_proxy.reset_when
    assert s3_proxy.resets >= 1 and rule.relaunched and rule.fifth_reads == s3_proxy.resets + 1
    assert (results["stream"]["relaunches"], results["stream"]["named"]) == ("1", "1")
    assert results["stream"]["iterations"] == results["stream"]["losses"] == "16"


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
