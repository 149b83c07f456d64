"""The peer directory: the driver-side rendezvous of the ring (real sockets on loopback)."""

from __future__ import annotations

import secrets
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sparktf.collective import PeerDirectory
from sparktf.collective.auth import HandshakeError, client_handshake
from sparktf.collective.directory import directory_peers
from sparktf.collective.rendezvous import parse_peer
from sparktf.errors import CollectiveError

SECRET = secrets.token_bytes(32)
WAIT = 30.0


def register_all(directory: PeerDirectory, world_size: int, secret: bytes = SECRET) -> list:
    """Every rank registers ``127.0.0.1:<1000 + rank>`` at once; their answers, by rank."""
    with ThreadPoolExecutor(world_size) as pool:
        answers = [
            pool.submit(directory_peers, directory.address, rank, world_size, f"127.0.0.1:{1000 + rank}",
                        secret, WAIT, WAIT)
            for rank in range(world_size)
        ]
        return [answer.result() for answer in answers]


def answer_of(sock: socket.socket) -> bytes:
    """What the other end sent before closing (a reset, with our bytes unread, counts as nothing)."""
    try:
        return sock.recv(1)
    except ConnectionResetError:
        return b""


def directory_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "sparktf-peer-directory"]


def test_every_rank_gets_every_address_in_rank_order():
    expected = [f"127.0.0.1:{1000 + rank}" for rank in range(3)]
    with PeerDirectory(3, SECRET, "127.0.0.1") as directory:
        assert register_all(directory, 3) == [expected] * 3
        assert register_all(directory, 3) == [expected] * 3  # a second round (a relaunched job)
    assert directory_threads() == []


def test_intruders_are_dropped_while_the_ranks_complete():
    with PeerDirectory(2, SECRET, "127.0.0.1") as directory:
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
    with PeerDirectory(2, SECRET, "127.0.0.1") as directory, ThreadPoolExecutor(1) as pool:
        with socket.create_connection(parse_peer(directory.address), timeout=WAIT) as first:
            client_handshake(first, SECRET, 0, 2, 2)
            first.sendall(struct.pack("!I", 11) + b"127.0.0.1:7")
            # rank 0 is relaunched: its new registration replaces (and closes) the first one
            again = pool.submit(directory_peers, directory.address, 0, 2, "127.0.0.1:8", SECRET, WAIT, WAIT)
            assert answer_of(first) == b""
        other = directory_peers(directory.address, 1, 2, "127.0.0.1:9", SECRET, WAIT, WAIT)
        assert other == again.result() == ["127.0.0.1:8", "127.0.0.1:9"]


def test_missing_rank_times_out_with_a_clear_error():
    with PeerDirectory(2, SECRET, "127.0.0.1") as directory:
        with pytest.raises(CollectiveError, match="not every one of the 2 ranks registered .* within 0.5 s"):
            directory_peers(directory.address, 0, 2, "127.0.0.1:1", SECRET, WAIT, 0.5)


def test_unreachable_directory_names_the_way_out():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = "127.0.0.1:%d" % unused.getsockname()[1]
    with pytest.raises(CollectiveError, match="spark.sparktf.rendezvous=barrier"):
        directory_peers(address, 0, 2, "127.0.0.1:1", SECRET, 0.3, WAIT)


def test_bad_registrations_are_dropped():
    with PeerDirectory(1, SECRET, "127.0.0.1") as directory:
        with pytest.raises(CollectiveError, match="peer directory"):
            directory_peers(directory.address, 0, 1, "no port here", SECRET, WAIT, WAIT)
        assert directory_peers(directory.address, 0, 1, "127.0.0.1:5", SECRET, WAIT, WAIT) == ["127.0.0.1:5"]


def test_rendezvous_setting_picks_the_driver_directory_or_allgather(sc):
    from pyspark import SparkConf

    from sparktf.spark.cluster import rendezvous_host
    from sparktf.errors import SparkTFError

    assert rendezvous_host(sc.getConf()) == "127.0.0.1"  # the default: a directory on spark.driver.host
    conf = SparkConf(loadDefaults=False).set("spark.driver.host", "10.1.2.3")
    assert rendezvous_host(conf) == "10.1.2.3"
    assert rendezvous_host(conf.set("spark.sparktf.rendezvous", "barrier")) is None
    with pytest.raises(SparkTFError, match="'driver' or 'barrier', got 'ring'"):
        rendezvous_host(conf.set("spark.sparktf.rendezvous", "ring"))


def test_training_falls_back_to_allgather_when_the_driver_host_cannot_be_listened_on(caplog):
    from sparktf.training.segment_job import peer_directory

    with peer_directory("192.0.2.1", 2, SECRET) as directory:  # TEST-NET-1: never this machine's address
        assert directory is None
    assert "BarrierTaskContext.allGather instead" in caplog.text
    with peer_directory("127.0.0.1", 2, SECRET) as directory:
        assert directory.startswith("127.0.0.1:")
    assert directory_threads() == []
    for host, workers in ((None, 2), ("127.0.0.1", 1)):
        with peer_directory(host, workers, SECRET) as directory:
            assert directory is None
