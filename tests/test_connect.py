"""sparktf in Spark Connect sessions (``tests/programs/connect_program.py``, a client of its own).

A Connect client and a classic session do not share one process, so the
client runs in a subprocess, twice: against a local Connect server
(``SPARK_REMOTE=local[2]``) and against a Connect server over
``local-cluster[1,2,1024]`` (an executor of its own, with two cores) that the
test starts with ``spark-submit`` and stops.
"""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import pyspark
import pytest

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "connect_program.py")
#: Seconds the Connect server over local-cluster gets to listen.
SERVER_START_SECONDS = 120


def client_env():
    return {name: value for name, value in os.environ.items() if name not in ("MASTER", "SPARK_MASTER")}


@contextlib.contextmanager
def connect_server(tmp_path):
    """A Spark Connect server over ``local-cluster[1,2,1024]`` on 127.0.0.1; yields its ``sc://`` address."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    submit = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")
    env = {**client_env(), "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    command = [submit, "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
               "--master", "local-cluster[1,2,1024]", "--conf", f"spark.connect.grpc.binding.port={port}",
               "--conf", "spark.connect.grpc.binding.address=127.0.0.1", "--conf", "spark.driver.host=127.0.0.1",
               "--conf", "spark.ui.enabled=false", "--conf", f"spark.executorEnv.PYSPARK_PYTHON={sys.executable}",
               "--conf", "spark.python.daemon.module=sparktf.spark.tf_daemon",
               "spark-internal"]
    log = open(tmp_path / "connect-server.log", "w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + SERVER_START_SECONDS
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert time.monotonic() < deadline, "the Connect server did not listen in time"
            try:
                code = server.wait(0.5)
            except subprocess.TimeoutExpired:
                continue
            raise AssertionError(f"the Connect server exited ({code}): "
                                 + (tmp_path / "connect-server.log").read_text()[-3000:])
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait(30)
        log.close()


def run_program(tmp_path, *remote):
    """``{case: {key: value}}`` of the program's RESULT lines."""
    proc = subprocess.run([sys.executable, PROGRAM, str(tmp_path), *remote], capture_output=True, text=True,
                          env=client_env(), timeout=400)
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            _, case, values = line.split(" ", 2)
            found[case] = json.loads(values)
    python_lines = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith(("\tat ", "  at ")))
    assert proc.returncode == 0 and "done" in found, (proc.stdout[-3000:], python_lines[-8000:])
    found["stderr"] = proc.stderr  # the client's, and with a local server its Python workers'
    return found


@pytest.fixture(scope="module", params=["local", "server"])
def results(request, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp(f"connect-{request.param}")
    if request.param == "local":
        return run_program(tmp_path)
    with connect_server(tmp_path) as address:
        return run_program(tmp_path, address)


def test_init_spark_returns_a_connect_session(results):
    assert results["session"] == {"module": "pyspark.sql.connect.session", "again": True}


def test_training_with_validation_callbacks_progress_checkpoints_summaries_then_evaluate_and_predict(results):
    train = case_of(results, "train")  # in the local session: a server's training runs in its other cases
    assert train["iterations"] == 24 and len(train["loss"]) == 24 and train["loss"][-1] < train["loss"][0] / 10
    assert len(train["val_loss"]) == 3
    assert [epoch for epoch, _ in train["epochs"]] == [0, 1, 2]
    assert all({"loss", "val_loss", "val_mae"} <= set(logs) for _, logs in train["epochs"])
    assert train["checkpoints"] == 3 and train["summary_rows"] == 24
    assert train["progress"] == ["Epoch 1/3", "Epoch 2/3", "Epoch 3/3"]
    for name in ("loss", "mae"):
        assert train["evaluated"][name] == pytest.approx(train["local"][name], rel=1e-4, abs=1e-5)
    assert train["prediction_error"] < 1e-4
    error, message = train["predict_rdd"]
    assert error == "SparkTFError" and "TFPredictor.predict" in message and "predict_dataframe" in message


def case_of(results, case):
    """``results[case]``; each session skips the cases whose code paths the other one runs."""
    if case not in results:
        pytest.skip(f"{case}: the same code path as in the other Connect session, run there")
    return results[case]


def test_a_stream_is_scored_from_the_client_and_optimize_stream_is_refused_by_name(results):
    stream = case_of(results, "stream")
    assert stream["rows"] == 40 and stream["error"] < 1e-5
    assert stream["refused"][0] == "ConfigurationError" and "classic Spark session" in stream["refused"][1]


def test_a_worker_failure_is_relaunched_and_ends_like_an_uninterrupted_run(results):
    recover = case_of(results, "recover")  # on the server: executors of their own relaunch
    assert recover["marker"] and recover["difference"] < 1e-5


def test_two_optimize_calls_from_client_threads_train_at_once_one_on_a_sparse_vector_column(results):
    concurrent = case_of(results, "concurrent")
    assert concurrent["errors"] == {"sparse": [None, ""], "dense": [None, ""]}
    assert concurrent["iterations"] == {"sparse": 2, "dense": 2}
    assert concurrent["difference"] < 1e-5  # the sparse column trains as its dense twin


def test_tfrecord_files_train_and_evaluate_in_both_cache_modes(results):
    for cache in ("True", "False"):
        records, iterations, evaluated, local = case_of(results, "tfrecord")[cache]
        assert records == 120 and iterations == 12
        assert evaluated == pytest.approx(local, rel=1e-4, abs=1e-5)


def test_an_ml_pipeline_fits_saves_and_loads_and_cross_validates(results):
    pipeline = results["pipeline"]
    assert pipeline["epochs"] == 2 and pipeline["rows"] == 128 and pipeline["difference"] < 1e-5
    if "cv_metrics" not in pipeline:
        pytest.skip("CrossValidator: the same code path as in the local Connect session, run there")
    assert len(pipeline["cv_metrics"]) == 2 and pipeline["cv_metrics"][1] < pipeline["cv_metrics"][0]
    assert pipeline["best_epochs"] == 3


def test_ctrl_c_in_the_client_cancels_the_training_job(results):
    interrupt = case_of(results, "interrupt")
    assert interrupt["raised_after"] is not None and interrupt["raised_after"] < 5
    assert interrupt["next_job"] < 30  # the blocked step holds its slot for 60 s unless the job was cancelled


def test_a_resource_profile_and_min_workers_on_a_cluster(request, results):
    if "server" not in request.node.callspec.id:
        pytest.skip("resource profiles need a cluster master, not local mode")
    cluster = results["cluster"]
    assert cluster["iterations"] == 4
    assert cluster["evaluated"] == pytest.approx(cluster["local"], rel=1e-4, abs=1e-5)


def test_the_python_workers_print_no_tensorflow_start_up_lines_but_real_errors(request, results):
    if "local" not in request.node.callspec.id:
        pytest.skip("the executors of a server over local-cluster write to its work folder")
    # warm-up, training, evaluation, prediction and TFRecord reading all ran in these workers
    assert "failed call to cuInit" not in results["stderr"]
    assert "Could not find cuda drivers" not in results["stderr"]
    assert "ValueError: planned failure in rank" in results["stderr"]  # sparktf.run's failing child, as it was


def test_run_starts_its_children_and_streams_their_lines_to_the_client(results):
    run = results["run"]
    assert run["value"] == {"rank": 0, "role": "worker 0", "tf_config_task": {"type": "worker", "index": 0}}
    assert run["lines"] == ["[worker 0] rank 0 of 2 says hi", "[worker 1] rank 1 of 2 says hi"]


def test_a_failing_child_and_too_many_workers_raise_sparktf_errors(results):
    failure = case_of(results, "run_failure")
    assert failure["error"] == "SparkTFError" and "planned failure in rank" in failure["message"]
    slots = case_of(results, "slots")
    assert slots["error"] == "SparkTFError" and "needs 3 tasks" in slots["message"] and "at most 2" in slots["message"]
    assert slots["seconds"] < 10


def test_entry_points_that_need_rdds_name_the_dataframe_alternative(results):
    rdd_only = case_of(results, "rdd_only")
    for entry in ("from_rdd", "from_string_rdd"):
        error, message = rdd_only[entry]
        assert error == "SparkTFError" and f"TFDataset.{entry}" in message and "from_dataframe" in message
    error, message = rdd_only["TFNet_distributed"]
    assert error == "SparkTFError" and "without distributed=True" in message
    assert rdd_only["TFNet_local"][0] == [[2.0, 2.0]] * 4


def test_a_bad_record_fails_the_count_as_the_record_its_task_sent_to_the_clients_inbox(results):
    bad_record = case_of(results, "bad_record")  # the program made reading Spark's text fail
    assert bad_record["error"] == "DataError" and "partition 0, row 2" in bad_record["message"], bad_record


def test_an_address_this_client_cannot_listen_on_fails_at_once_naming_the_setting_and_is_not_relaunched(results):
    driver_host = case_of(results, "driver_host")
    assert driver_host["error"] == "ConfigurationError" and "spark.sparktf.driverHost" in driver_host["message"]
    assert "192.0.2.1" in driver_host["message"] and driver_host["seconds"] < 5
    name, message, seconds = driver_host["optimize"]  # a setting that cannot work is never relaunched
    assert name == "ConfigurationError" and "cannot bind '192.0.2.1'" in message and seconds < 5, driver_host
