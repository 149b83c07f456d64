"""sparktf.launch pieces without Spark: TF_CONFIG, master->chief, ports, ctx paths, failure text, pickling, checks."""

import errno
import json
import socket
import sys
import threading

import cloudpickle
import pytest

import sparktf
from sparktf.launch import failures
from sparktf.launch.context import absolute_path
from sparktf.launch.logstream import LogClient, LogServer
from sparktf.launch.ports import PortReservation
from sparktf.launch.program import pickle_program
from sparktf.launch.tf_config import build_tf_config, master_to_chief, task_roles

SEED_001_MASTER = {
    "cluster": {"master": ["ip0:2222"], "ps": ["ip0:2223", "ip1:2223"], "worker": ["ip1:2222"]},
    "task": {"type": "master", "index": 0},
    "environment": "cloud",
}


def test_master_to_chief_converts_the_seed_config():
    converted = master_to_chief(json.dumps(SEED_001_MASTER))
    assert converted == {
        "cluster": {"chief": ["ip0:2222"], "ps": ["ip0:2223", "ip1:2223"], "worker": ["ip1:2222"]},
        "task": {"type": "chief", "index": 0},
        "environment": "cloud",
    }
    assert SEED_001_MASTER["task"]["type"] == "master"  # the argument is not changed


def test_master_to_chief_keeps_other_tasks_and_refuses_two_chiefs():
    worker = dict(SEED_001_MASTER, task={"type": "worker", "index": 0})
    assert master_to_chief(worker)["task"] == {"type": "worker", "index": 0}
    assert master_to_chief(worker)["cluster"]["chief"] == ["ip0:2222"]
    chief_style = {"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "chief", "index": 0}}
    assert master_to_chief(chief_style) == chief_style
    with pytest.raises(ValueError, match="both"):
        master_to_chief({"cluster": {"master": ["a:1"], "chief": ["b:1"]}, "task": {"type": "master", "index": 0}})
    with pytest.raises(ValueError, match="2 'master' tasks"):
        master_to_chief({"cluster": {"master": ["a:1", "b:1"]}, "task": {"type": "master", "index": 0}})


def test_tf_config_roles_with_and_without_chief():
    addresses = ["h0:10", "h1:11", "h2:12"]
    assert task_roles(3) == [("worker", 0), ("worker", 1), ("worker", 2)]
    assert build_tf_config(addresses, 2) == {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": 2}}
    chief_config = build_tf_config(addresses, 0, "chief")
    assert chief_config == {"cluster": {"chief": ["h0:10"], "worker": ["h1:11", "h2:12"]},
                            "task": {"type": "chief", "index": 0}}
    assert build_tf_config(addresses, 2, "chief")["task"] == {"type": "worker", "index": 1}
    with pytest.raises(ValueError, match="master_node"):
        task_roles(2, "master")


def test_concurrent_reservations_get_distinct_ports_that_nobody_else_gets():
    reservations, lock = [], threading.Lock()

    def reserve():
        for _ in range(25):
            held = PortReservation()
            with lock:
                reservations.append(held)

    threads = [threading.Thread(target=reserve) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    held_ports = {held.port for held in reservations}
    try:
        assert len(held_ports) == len(reservations) == 200
        # the kernel hands none of them to anyone else asking for a free port ...
        others = []
        for _ in range(1000):
            other = socket.socket()
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("127.0.0.1", 0))
            others.append(other)
        assert held_ports.isdisjoint(other.getsockname()[1] for other in others)
        for other in others:
            other.close()
        # ... and a plain bind to a held port fails, on loopback and on the wildcard address
        port = reservations[0].port
        for address in ("127.0.0.1", "0.0.0.0"):
            with socket.socket() as plain, pytest.raises(OSError) as refused:
                plain.bind((address, port))
            assert refused.value.errno == errno.EADDRINUSE
    finally:
        for held in reservations:
            held.close()


def test_a_server_with_reuseaddr_takes_over_the_held_port_and_serves():
    with PortReservation() as held:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TensorFlow's gRPC server does
        server.bind(("0.0.0.0", held.port))
        server.listen()
        with server, socket.create_connection(("127.0.0.1", held.port), timeout=5) as client:
            accepted, _ = server.accept()
            with accepted:
                client.sendall(b"ping")
                assert accepted.recv(4) == b"ping"


def test_absolute_path_follows_tfos_rules(tmp_path):
    assert absolute_path("gs://bucket/x", "hdfs://nn:8020", "/w") == "gs://bucket/x"
    assert absolute_path("data/x", "file:///", str(tmp_path)) == str(tmp_path / "data" / "x")
    assert absolute_path("/abs/x", "file:///", "/w") == "/abs/x"
    assert absolute_path("/abs/x", "hdfs://nn:8020/", "/w") == "hdfs://nn:8020/abs/x"
    assert absolute_path("rel", "hdfs://nn:8020", "/w").startswith("hdfs://nn:8020/user/")


def test_failure_message_names_role_exit_and_exception():
    output = ["noise"] * 300 + [
        "Traceback (most recent call last):",
        '  File "prog.py", line 3, in main_fun',
        "    raise ValueError('bad input')",
        "ValueError: bad input",
    ]
    message = failures.failure_message("worker 1", 1, output)
    assert message.splitlines()[0] == "sparktf.run: worker 1 failed (exit code 1): ValueError: bad input"
    assert "noise" not in message and len(message.splitlines()) == 6
    killed = failures.failure_message("chief 0", -9, [f"line {i}" for i in range(100)])
    assert "killed by SIGKILL" in killed.splitlines()[0] and killed.splitlines()[-1] == "line 99"
    assert len(killed.splitlines()) == 2 + failures.LINES_WITHOUT_TRACEBACK


def _defined_in_a_test_module(args, ctx):
    return args + 1


def test_functions_of_a_test_module_are_pickled_by_value():
    program = pickle_program(_defined_in_a_test_module, 41)
    sys.modules["_hidden"] = sys.modules.pop(__name__)  # the module cannot be imported any more
    try:
        main_fun, args = cloudpickle.loads(program)
    finally:
        sys.modules[__name__] = sys.modules.pop("_hidden")
    assert main_fun(args, None) == 42
    with pytest.raises(TypeError, match="cannot pickle"):
        pickle_program(_defined_in_a_test_module, threading.Lock())


def test_parameter_servers_are_refused_with_the_reason_before_any_job():
    with pytest.raises(NotImplementedError, match="ParameterServerStrategy.*num_ps=0"):
        sparktf.run(_defined_in_a_test_module, num_workers=1, num_ps=1)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"num_workers": 0}, ValueError),
        ({"master_node": "master"}, ValueError),
        ({"env": {"TF_CONFIG": "{}"}}, ValueError),
        ({"env": {"A": 1}}, TypeError),
        ({"timeout": -1}, ValueError),
    ],
)
def test_bad_arguments_are_refused(kwargs, error):
    with pytest.raises(error):
        sparktf.run(_defined_in_a_test_module, **kwargs)


def test_the_log_server_takes_lines_and_acknowledged_failures_from_clients_that_prove_the_secret():
    lines = []
    with LogServer("127.0.0.1", lines.append) as server:
        client = LogClient(server.address, server.secret)
        client.send("[worker 0] héllo")
        assert client.report_failure("sparktf.run: worker 0 failed (exit code 1): ValueError: bad")
        assert server.failures() == ["sparktf.run: worker 0 failed (exit code 1): ValueError: bad"]
        client.close()
        intruder = LogClient(server.address, b"not the secret")
        intruder.send("[worker 1] forged")
        assert not intruder.report_failure("forged failure")  # the server closed the connection
        intruder.close()
    assert lines == ["[worker 0] héllo"] and len(server.failures()) == 1
