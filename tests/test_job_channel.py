"""The job channel: the driver's server for a barrier job's ranks (real sockets on loopback).

The peer directory, model state both ways, reports, and listeners that a silent
or hostile local process cannot block.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from sparktf.collective import JobChannel
from sparktf.collective.auth import HandshakeError, client_handshake
from sparktf.collective.channel_client import MAX_REPORTED_BATCHES, ChannelClient, Heartbeat, directory_peers
from sparktf.collective.channel_wire import send_message
from sparktf.collective.rendezvous import HANDSHAKE_SECONDS, parse_peer
from sparktf.errors import CollectiveError

SECRET = secrets.token_bytes(32)
WAIT = 30.0


def register_all(directory: JobChannel, world_size: int, secret: bytes = SECRET, claims=None) -> list:
    """Every rank registers ``127.0.0.1:<1000 + rank>`` (and ``claims[rank]``) at once; their peer lists, by rank
    (``(peers, claims)`` with ``claims``)."""
    with ThreadPoolExecutor(world_size) as pool:
        answers = [
            pool.submit(directory_peers, directory.address, rank, world_size, f"127.0.0.1:{1000 + rank}",
                        secret, WAIT, WAIT, None if claims is None else claims[rank])
            for rank in range(world_size)
        ]
        return [answer.result() if claims is not None else answer.result()[0] for answer in answers]


def answer_of(sock: socket.socket) -> bytes:
    """What the other end sent before closing (a reset, with our bytes unread, counts as nothing)."""
    try:
        return sock.recv(1)
    except ConnectionResetError:
        return b""


def directory_threads() -> list:
    return [t for t in threading.enumerate() if t.name.startswith("sparktf-job-channel") and t.is_alive()]


def test_every_rank_gets_every_address_and_claim_in_rank_order():
    expected = [f"127.0.0.1:{1000 + rank}" for rank in range(3)]
    with JobChannel(3, SECRET, "127.0.0.1") as directory:
        assert register_all(directory, 3) == [expected] * 3
        # a second round (a relaunched job), with what each rank's process holds ready
        assert register_all(directory, 3, claims=[None, 2, 0]) == [(expected, [None, 2, 0])] * 3
    assert directory_threads() == []


def test_intruders_are_dropped_while_the_ranks_complete():
    with JobChannel(2, SECRET, "127.0.0.1") as directory:
        address = parse_peer(directory.address)
        with socket.create_connection(address, timeout=WAIT) as garbage:
            garbage.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 100)
            assert answer_of(garbage) == b""  # closed without an answer
        with socket.create_connection(address, timeout=WAIT) as wrong:
            with pytest.raises(HandshakeError, match="did not prove it knows the job secret"):
                client_handshake(wrong, secrets.token_bytes(32), 0, 2, 2)
        with pytest.raises(CollectiveError, match="could not authenticate with the peer directory"):
            directory_peers(directory.address, 0, 2, "127.0.0.1:1", secrets.token_bytes(32), WAIT, WAIT)
        assert register_all(directory, 2) == [["127.0.0.1:1000", "127.0.0.1:1001"]] * 2


def test_a_rank_that_registers_again_replaces_its_entry():
    with JobChannel(2, SECRET, "127.0.0.1") as directory, ThreadPoolExecutor(1) as pool:
        with socket.create_connection(parse_peer(directory.address), timeout=WAIT) as first:
            client_handshake(first, SECRET, 0, 2, 2)
            send_message(first, {"op": "register", "peer": "127.0.0.1:7"})
            deadline = time.monotonic() + WAIT  # the first registration must be in before the relaunch's
            while 0 not in directory._registered:
                assert time.monotonic() < deadline, "the directory never recorded rank 0's first registration"
                time.sleep(0.01)
            # rank 0 is relaunched: its new registration replaces (and closes) the first one
            again = pool.submit(directory_peers, directory.address, 0, 2, "127.0.0.1:8", SECRET, WAIT, WAIT)
            assert answer_of(first) == b""
        other = directory_peers(directory.address, 1, 2, "127.0.0.1:9", SECRET, WAIT, WAIT)
        assert other == again.result() == (["127.0.0.1:8", "127.0.0.1:9"], [None, None])


def test_missing_rank_times_out_with_a_clear_error():
    with JobChannel(2, SECRET, "127.0.0.1") as directory:
        with pytest.raises(CollectiveError, match="not every one of the 2 ranks registered .* within 0.5 s"):
            directory_peers(directory.address, 0, 2, "127.0.0.1:1", SECRET, WAIT, 0.5)


def test_unreachable_directory_names_the_way_out():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = "127.0.0.1:%d" % unused.getsockname()[1]
    with pytest.raises(CollectiveError, match="spark.sparktf.rendezvous=barrier"):
        directory_peers(address, 0, 2, "127.0.0.1:1", SECRET, 0.3, WAIT)


def test_bad_registrations_are_dropped():
    with JobChannel(1, SECRET, "127.0.0.1") as directory:
        with pytest.raises(CollectiveError, match="peer directory"):
            directory_peers(directory.address, 0, 1, "no port here", SECRET, WAIT, WAIT)
        for claim in (1, -1, "0", 0.0):  # a claim is None or an index below the world size
            with pytest.raises(CollectiveError, match="peer directory"):
                directory_peers(directory.address, 0, 1, "127.0.0.1:5", SECRET, WAIT, WAIT, claim)
        assert directory_peers(directory.address, 0, 1, "127.0.0.1:5", SECRET, WAIT, WAIT, 0) == (["127.0.0.1:5"], [0])


def test_rendezvous_setting_picks_the_driver_directory_or_allgather_and_an_address_not_here_fails_at_once(spark):
    from pyspark import SparkConf

    from sparktf.errors import ConfigurationError
    from sparktf.spark.classic_session import ClassicSession

    class SessionWithConf(ClassicSession):
        def __init__(self, conf):
            self._conf = conf

        @property
        def conf(self):
            return self._conf

    assert ClassicSession(spark).rendezvous_host() == "127.0.0.1"  # the default: a directory on spark.driver.host
    conf = SparkConf(loadDefaults=False).set("spark.driver.host", "127.0.0.1")
    chosen = SparkConf(loadDefaults=False).setAll(conf.getAll()).set("spark.sparktf.driverHost", "127.0.0.2")
    assert SessionWithConf(chosen).rendezvous_host() == "127.0.0.2"  # another address of this machine (lo's /8)
    for key, where in (("spark.sparktf.driverHost", "spark.sparktf.driverHost='192.0.2.1' is not an address of "
                                                    "this machine"), ("spark.driver.host", "spark.driver.host='192.0.2.1'")):
        elsewhere = SparkConf(loadDefaults=False).setAll(conf.getAll()).set(key, "192.0.2.1")  # TEST-NET-1
        with pytest.raises(ConfigurationError, match=f"cannot bind '192.0.2.1' .*{where}"):
            SessionWithConf(elsewhere).rendezvous_host()
    assert SessionWithConf(conf.set("spark.sparktf.rendezvous", "barrier")).rendezvous_host() is None
    with pytest.raises(ConfigurationError, match="'driver' or 'barrier', got 'ring'"):
        SessionWithConf(conf.set("spark.sparktf.rendezvous", "ring")).rendezvous_host()


def test_watchdog_slack_is_a_local_property_or_the_configuration(spark, sc):
    from sparktf.errors import SparkTFError
    from sparktf.spark.classic_session import ClassicSession
    from sparktf.spark.cluster import WATCHDOG_SLACK_CONF, watchdog_slack

    session = ClassicSession(spark)

    assert watchdog_slack(session) == 30.0
    try:
        sc.setLocalProperty(WATCHDOG_SLACK_CONF, "12s")
        assert watchdog_slack(session) == 12.0
        for bad in ("-1", "nan", "soon"):
            sc.setLocalProperty(WATCHDOG_SLACK_CONF, bad)
            with pytest.raises(SparkTFError, match=f"spark.sparktf.watchdogSlack must be .* got '{bad}'"):
                watchdog_slack(session)
    finally:
        sc.setLocalProperty(WATCHDOG_SLACK_CONF, None)
    assert watchdog_slack(session) == 30.0


def test_training_falls_back_to_allgather_when_the_driver_host_cannot_be_listened_on(caplog):
    from sparktf.training.driver.served_job import job_channel

    with job_channel("192.0.2.1", 2, SECRET) as channel:  # TEST-NET-1: never this machine's address
        assert channel is None
    assert "BarrierTaskContext.allGather" in caplog.text
    for workers in (1, 2):
        with job_channel("127.0.0.1", workers, SECRET) as channel:
            assert channel.address.startswith("127.0.0.1:")
    assert directory_threads() == []
    with job_channel(None, 2, SECRET) as channel:
        assert channel is None


def test_state_streams_to_every_rank_and_back_from_rank_0():
    rng = np.random.default_rng(0)
    state = [rng.normal(size=(300, 1000)).astype(np.float32), np.arange(7, dtype=np.int64), np.array(True)]
    with JobChannel(2, SECRET, "127.0.0.1") as channel:
        channel.serve_state({"iteration": 3}, state)
        for rank in range(2):
            with ChannelClient(channel.address, rank, 2, SECRET, WAIT) as client:
                meta, arrays = client.request({"op": "get_state"}, WAIT)
            assert meta == {"iteration": 3}
            assert [a.dtype for a in arrays] == [a.dtype for a in state]
            assert all(np.array_equal(got, sent) for got, sent in zip(arrays, state))
        with ChannelClient(channel.address, 0, 2, SECRET, WAIT) as client:
            client.request({"op": "put_state", "meta": {"iteration": 4}}, WAIT, [a + 1 for a in state[:2]])
        meta, arrays = channel.take_uploaded()[0]
        assert meta == {"iteration": 4} and np.array_equal(arrays[0], state[0] + 1)
        assert channel.take_uploaded() == {}  # handed over once
        with ChannelClient(channel.address, 1, 2, SECRET, WAIT) as client:  # a rank that fetched no rows uploads none
            with pytest.raises(CollectiveError, match="failed"):
                client.request({"op": "put_state", "meta": {}}, WAIT, state[:1])


def test_a_rank_fetches_some_arrays_rows_only_and_sends_back_at_most_those():
    state = [np.arange(40, dtype=np.float32).reshape(10, 4), np.arange(10, dtype=np.float32), np.array(3)]
    with JobChannel(2, SECRET, "127.0.0.1") as channel:
        channel.serve_state({"iteration": 1}, state)
        with ChannelClient(channel.address, 1, 2, SECRET, WAIT) as client:
            _, arrays = client.request({"op": "get_state", "rows": [[0, 5, 10], [1, 5, 10]]}, WAIT)
            assert np.array_equal(arrays[0], state[0][5:]) and np.array_equal(arrays[1], state[1][5:])
            assert arrays[2] == 3  # the arrays not named come whole
            client.request({"op": "put_state", "meta": {"rows": [[0, 5, 10], [1, 5, 10]]}}, WAIT, arrays[:2])
            with pytest.raises(CollectiveError, match="failed"):  # more than twice the rows it fetched
                client.request({"op": "put_state", "meta": {}}, WAIT, [np.zeros(200, np.float32)])
        assert sorted(channel.take_uploaded()) == [1]


def test_reports_record_when_progress_last_changed():
    with JobChannel(2, SECRET, "127.0.0.1") as channel:
        heartbeat = Heartbeat(ChannelClient(channel.address, 1, 2, SECRET, WAIT), exit_when_orphaned=False)
        heartbeat.phase, heartbeat.iteration = "train", 5
        deadline = time.monotonic() + WAIT
        while channel.reports().get(1, None) is None or channel.reports()[1].iteration != 5:
            assert time.monotonic() < deadline, "no report arrived"
            time.sleep(0.05)
        first = channel.reports()[1]
        assert first.phase == "train" and 0 not in channel.reports()
        heartbeat.stop()


def test_a_failure_report_is_held_by_the_driver_when_stop_returns():
    from sparktf.errors import DataError, FailureRecord

    record = FailureRecord.of(DataError("partition 1, record 7: bad"), rank=1, shard=1)
    with JobChannel(2, SECRET, "127.0.0.1") as channel:
        heartbeat = Heartbeat(ChannelClient(channel.address, 1, 2, SECRET, WAIT), exit_when_orphaned=False)
        heartbeat.phase = "train"
        started = time.monotonic()
        heartbeat.stop(failure=record)  # acknowledged: no poll, the record is there before the task may fail
        assert channel.reports()[1].failure == record
        assert time.monotonic() - started < HANDSHAKE_SECONDS / 2  # answered, not waited out


def test_reports_carry_every_iteration_in_order_and_the_channel_hands_each_over_once():
    count = 3 * MAX_REPORTED_BATCHES + 5  # more than one report carries: a full backlog goes at once
    with JobChannel(2, SECRET, "127.0.0.1") as channel:
        heartbeat = Heartbeat(ChannelClient(channel.address, 0, 2, SECRET, WAIT), exit_when_orphaned=False)
        heartbeat.set_batch_names(["loss", "accuracy"])
        heartbeat.phase = "train"
        for iteration in range(1, count + 1):
            heartbeat.iteration = iteration
            heartbeat.add_batch(iteration, (1.0 / iteration, iteration / 1000))
        received, deadline = [], time.monotonic() + WAIT
        while len(received) < count:
            assert time.monotonic() < deadline, f"{len(received)} of {count} iterations arrived"
            report = channel.reports(take_batches=True).get(0)
            if report is not None and report.batches:
                assert report.batch_names == ("loss", "accuracy")
                received.extend(report.batches)
            time.sleep(0.05)
        heartbeat.stop()
        assert received == [(i, (1.0 / i, i / 1000)) for i in range(1, count + 1)]  # exact, in order
        assert channel.reports(take_batches=True)[0].batches == () and channel.reports()[0].iteration == count


def test_a_silent_connection_does_not_block_the_ranks():
    with JobChannel(2, SECRET, "127.0.0.1") as channel:
        address = parse_peer(channel.address)
        silent = [socket.create_connection(address, timeout=WAIT) for _ in range(3)]
        started = time.monotonic()
        assert register_all(channel, 2) == [["127.0.0.1:1000", "127.0.0.1:1001"]] * 2
        assert time.monotonic() - started < 5  # the handshake deadline of the silent ones is 10 s
        for sock in silent:
            sock.close()


def test_unauthenticated_connections_are_capped(caplog):
    from sparktf.collective.rendezvous import MAX_AUTHENTICATING

    with JobChannel(1, SECRET, "127.0.0.1") as channel:
        address = parse_peer(channel.address)
        silent = [socket.create_connection(address, timeout=WAIT) for _ in range(MAX_AUTHENTICATING + 4)]
        refused = 0
        for sock in silent[MAX_AUTHENTICATING:]:
            refused += answer_of(sock) == b""  # closed at once, not held for the handshake deadline
        assert refused == 4
        assert "others are still authenticating" in caplog.text
        for sock in silent:
            sock.close()
        deadline = time.monotonic() + WAIT
        while True:  # the slots come back as the silent ones are dropped
            try:
                assert directory_peers(channel.address, 0, 1, "127.0.0.1:5", SECRET, WAIT, WAIT)[0] == ["127.0.0.1:5"]
                break
            except CollectiveError:
                assert time.monotonic() < deadline


def test_a_task_asks_for_a_tables_rows_by_id_and_bad_requests_are_dropped():
    """Sharded evaluation: a task asks for a batch's rows of a served table by id, in its order; ids out of the
    table, or of another dtype, end that connection (the task fails; nothing is served)."""
    from sparktf.training.state_source import StateSource

    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    with JobChannel(2, SECRET, "127.0.0.1") as channel:
        channel.serve_state({"iteration": 1}, [table, np.array(3)])
        source = StateSource(channel.address, SECRET, 2, WAIT)
        with source.rows_by_id(1) as rows:
            assert np.array_equal(rows(0, np.array([7, 2, 7])), table[[7, 2, 7]])
            assert rows(0, np.zeros(0, np.int64)).shape == (0, 4)
        for index, ids in ((0, np.array([10])), (0, np.array([-1])), (1, np.array([0]))):
            with source.rows_by_id(1) as rows, pytest.raises(CollectiveError, match="failed"):
                rows(index, ids)
        with ChannelClient(channel.address, 1, 2, SECRET, WAIT) as client, pytest.raises(CollectiveError):
            client.request({"op": "get_rows", "index": 0}, WAIT, [np.array([1.0])])  # float ids
