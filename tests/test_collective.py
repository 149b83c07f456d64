"""The ring collective among real processes on loopback: results, faults and authentication."""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import struct
import threading
import time

import ml_dtypes
import numpy as np
import pytest

from sparktf.collective import WIRE_DTYPES, Communicator
from sparktf.collective.auth import HandshakeError, client_handshake
from sparktf.collective.rendezvous import parse_peer
from sparktf.collective.ring import _divide
from sparktf.errors import CollectiveError

from ring_harness import CONTEXT, JOIN_SECONDS, Ranks, collective_threads, run_ranks

SIZES = (0, 1, 7, 1000003)
# compressed segments hold 2**19 values: a chunk of 1600003 / 2 or / 3 spans two of them
COMPRESSED_SIZES = (0, 1, 7, 1600003)
DTYPES = ("float32", "float64", "int32", "int64")


# --------------------------------------------------------------------------- scenarios (run in the ranks)

def _inputs(dtype, size, world_size):
    rng = np.random.default_rng(size)
    if dtype.startswith("float"):
        return [rng.standard_normal(size).astype(dtype) for _ in range(world_size)]
    return [rng.integers(-(1 << 20), 1 << 20, size).astype(dtype) for _ in range(world_size)]


def _mismatch(result, inputs, op):
    world_size, dtype = len(inputs), inputs[0].dtype
    if dtype.kind == "f":
        expected = np.sum(np.stack(inputs).astype(np.float64), axis=0)
        if op == "mean":
            expected /= world_size
        tolerance = 1e-5 if dtype == np.float32 else 1e-12
        return not np.allclose(result, expected, rtol=tolerance, atol=tolerance)
    expected = np.sum(np.stack(inputs), axis=0, dtype=dtype)
    if op == "mean":
        expected = np.floor_divide(expected, world_size)
    return not np.array_equal(result, expected)


def allreduce_every_case(rank, peers, listener, secret):
    """Every dtype, size and op, one after the other on the same communicator; returns failures and digests."""
    failures, digests = [], []
    with Communicator.from_peers(rank, peers, secret, timeout=30, listener=listener) as comm:
        for dtype in DTYPES:
            for size in SIZES:
                inputs = _inputs(dtype, size, len(peers))
                for op in ("sum", "mean"):
                    buffer = inputs[rank].copy()
                    assert comm.allreduce(buffer, op=op) is buffer
                    if _mismatch(buffer, inputs, op):
                        failures.append((dtype, size, op))
                    digests.append(hashlib.sha256(buffer.tobytes()).hexdigest())
        matrix = np.arange(12, dtype=np.float32).reshape(3, 4).T * (rank + 1)  # Fortran-ordered view
        comm.allreduce(matrix, op="sum")
        if not np.array_equal(matrix, np.arange(12, dtype=np.float32).reshape(3, 4).T * sum(range(1, len(peers) + 1))):
            failures.append("fortran-ordered")
    return failures, digests


def _compression_error_bound(inputs, compression, divisor):
    """The largest error a compressed sum of ``inputs`` divided by ``divisor`` may have, per element.

    A wire dtype of ``p`` significant bits (bf16: 8, fp16: 11) rounds to
    nearest with a relative error of at most ``u = 2**-p``.  With ``n`` ranks a
    value is rounded ``n`` times: the ``n - 1`` partial sums sent in the
    reduce-scatter and the owner's final sum.  Each of those values, and each
    of the ``n - 1`` float32 additions (error ``2**-24``), is at most
    ``A = sum(|x_i|)`` (times ``(1 + u)**n`` for the errors before it).  fp16
    values below 2**-14 are subnormal with a spacing of 2**-24, so there a
    rounding may add ``2**-25`` absolute instead (bf16 has float32's exponent
    range).  A mean divides the relative part by ``n`` (its float32 division
    adds one ``2**-24`` on a value ``n`` times smaller), not the absolute part.
    """
    n, wire = len(inputs), WIRE_DTYPES[compression]
    u = 2.0 ** -(ml_dtypes.finfo(wire).nmant + 1)
    absolute = ml_dtypes.finfo(wire).smallest_subnormal / 2 if compression == "fp16" else 0.0
    magnitude = np.sum(np.abs(np.stack(inputs).astype(np.float64)), axis=0)
    return n * ((u + 2.0 ** -24) * (1 + u) ** n * magnitude / divisor + absolute)


def compressed_allreduce_cases(rank, peers, listener, secret):
    """bf16 and fp16 sums and means of float32 buffers; returns failures and digests."""
    failures, digests = [], []
    n = len(peers)
    with Communicator.from_peers(rank, peers, secret, timeout=30, listener=listener) as comm:
        for compression in WIRE_DTYPES:
            for size in COMPRESSED_SIZES:
                inputs = _inputs("float32", size, n)
                exact = np.sum(np.stack(inputs).astype(np.float64), axis=0)
                for op, divisor in (("sum", 1), ("mean", n)):
                    buffer = inputs[rank].copy()
                    comm.allreduce(buffer, op=op, compression=compression)
                    error = np.abs(buffer - exact / divisor)
                    if np.any(error > _compression_error_bound(inputs, compression, divisor)):
                        failures.append((compression, size, op, "outside the bound"))
                    if not np.array_equal(buffer, buffer.astype(WIRE_DTYPES[compression]).astype(np.float32)):
                        failures.append((compression, size, op, "not rounded to the wire dtype"))
                    digests.append(hashlib.sha256(buffer.tobytes()).hexdigest())
        overflow = np.full(3, 40000.0, dtype=np.float32)  # the sum is beyond float16's 65504
        comm.allreduce(overflow, op="sum", compression="fp16")
        if not np.all(np.isposinf(overflow)):
            failures.append(("fp16", "overflow", overflow.tolist()))
        integers = np.arange(7, dtype=np.int32) * (rank + 1)
        comm.allreduce(integers, op="sum", compression="bf16")
        if integers.tolist() != (np.arange(7) * sum(range(1, n + 1))).tolist():
            failures.append(("bf16", "int32 not exact", integers.tolist()))
    return failures, digests


def broadcast_gather_barrier(rank, peers, listener, secret, last_rank_entered):
    root = len(peers) - 1
    with Communicator.from_peers(rank, peers, secret, timeout=30, listener=listener) as comm:
        floats = np.arange(1000003, dtype=np.float64) * (rank + 1)
        comm.broadcast(floats, root=root)
        small = np.full(7, rank, dtype=np.int32)
        comm.broadcast(small, root=0)
        gathered = comm.allgather_object({"rank": rank, "text": "é" * rank, "list": [rank, None]})
        if rank == root:
            last_rank_entered.value = 1
        comm.barrier()
        seen_after_barrier = last_rank_entered.value
        return (bool(np.array_equal(floats, np.arange(1000003, dtype=np.float64) * (root + 1))),
                small.tolist(), gathered, seen_after_barrier, comm.rank, comm.world_size)


# a part of 0 elements, one of a few, one spanning several 1 MiB frames
ALLGATHERV_COUNTS = (0, 5, 600001)


def allgatherv_parts(rank, peers, listener, secret):
    world_size = len(peers)
    counts = [ALLGATHERV_COUNTS[(r + 1) % 3] for r in range(world_size)]
    with Communicator.from_peers(rank, peers, secret, timeout=30, listener=listener) as comm:
        floats = comm.allgatherv(np.arange(counts[rank], dtype=np.float32) + 1000 * rank, counts)
        pairs = comm.allgatherv(np.full((counts[rank] % 7, 2), rank, dtype=np.int64), [c % 7 * 2 for c in counts])
        return hashlib.sha256(floats.tobytes()).hexdigest(), pairs.reshape(-1, 2).tolist()


def alltoall_count(source, destination):
    """Elements rank ``source`` sends ``destination``: none, a few, or more than one frame (float32)."""
    return (0, 3, 300001, 1)[(source + 2 * destination) % 4]


def alltoall_part(source, destination, dtype):
    return (np.arange(alltoall_count(source, destination)) + 1000 * source + 100 * destination).astype(dtype)


def alltoallv_parts(rank, peers, listener, secret):
    world_size = len(peers)
    counts = [[alltoall_count(s, d) for d in range(world_size)] for s in range(world_size)]
    with Communicator.from_peers(rank, peers, secret, timeout=30, listener=listener) as comm:
        floats = comm.alltoallv([alltoall_part(rank, d, np.float32) for d in range(world_size)], counts)
        ids = comm.alltoallv([alltoall_part(rank, d, np.int64) for d in range(world_size)], counts)
        return [hashlib.sha256(part.tobytes()).hexdigest() for part in floats + ids]


def allreduce_until_failure(rank, peers, listener, secret, started):
    """Loop 8 MiB all-reduces; the victim rank signals after the first so the test can kill it mid-run."""
    comm = Communicator.from_peers(rank, peers, secret, timeout=30, listener=listener)
    buffer = np.ones(2 << 20, dtype=np.float32)
    while True:
        begin = time.monotonic()
        try:
            comm.allreduce(buffer)
        except CollectiveError as exc:
            elapsed = time.monotonic() - begin
            try:
                comm.barrier()
                reused = "reusable after failure"
            except CollectiveError as again:
                reused = str(again)
            return str(exc), elapsed, reused
        if rank == len(peers) - 1:
            started.set()


def silent_peer(rank, peers, listener, secret, released):
    """The last rank connects but never takes part; every other rank's all-reduce must time out naming it."""
    comm = Communicator.from_peers(rank, peers, secret, timeout=2, listener=listener)
    if rank == len(peers) - 1:
        released.wait(JOIN_SECONDS)
        comm.close()
        return None
    begin = time.monotonic()
    try:
        comm.allreduce(np.ones(1000, dtype=np.float32))
    except CollectiveError as exc:
        return str(exc), time.monotonic() - begin, collective_threads()
    return "no error", 0.0, []


def absent_peer(rank, peers, listener, secret, released):
    """Rank 1 keeps its socket listening but never joins; rank 0's constructor must fail naming it."""
    if rank == 1:
        released.wait(JOIN_SECONDS)
        listener.close()
        return None
    begin = time.monotonic()
    try:
        Communicator.from_peers(rank, peers, secret, timeout=1, listener=listener)
    except CollectiveError as exc:
        return str(exc), time.monotonic() - begin, collective_threads()
    finally:
        released.set()
    return "no error", 0.0, []


def mismatched_sizes(rank, peers, listener, secret):
    with Communicator.from_peers(rank, peers, secret, timeout=30, listener=listener) as comm:
        try:
            comm.allreduce(np.ones(10 + 2 * rank, dtype=np.float32))
        except CollectiveError as exc:
            return str(exc)
    return "no error"


def one_allreduce(rank, peers, listener, secret):
    with Communicator.from_peers(rank, peers, secret, timeout=30, listener=listener) as comm:
        return comm.allreduce(np.full(5, rank + 1, dtype=np.int64), op="sum").tolist()


# --------------------------------------------------------------------------- tests

@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_allreduce_matches_numpy_for_every_dtype_and_size(world_size):
    reports = run_ranks(world_size, allreduce_every_case)
    for rank, (failures, _) in enumerate(reports):
        assert failures == [], f"rank {rank} got wrong results for {failures}"
    assert all(digests == reports[0][1] for _, digests in reports), "ranks ended with different bits"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_mean_divides_exactly_also_where_it_multiplies(dtype):
    """Over a power-of-two world the mean multiplies by 1 / n: bit for bit the quotient, subnormals included."""
    info = np.finfo(dtype)
    values = np.concatenate([
        np.random.default_rng(0).standard_normal(4096).astype(dtype) * np.logspace(-40, 30, 4096, dtype=dtype),
        np.array([info.max, -info.max, info.tiny, 3 * info.smallest_subnormal, 0.0, -0.0, np.inf, -np.inf],
                 dtype=dtype)])
    for world_size in (2, 3, 4, 8):
        segment = values.copy()
        _divide(segment, world_size)
        assert segment.tobytes() == np.divide(values, world_size).tobytes(), world_size


@pytest.mark.parametrize("world_size", [2, 3])
def test_compressed_allreduce_is_close_and_identical_on_every_rank(world_size):
    reports = run_ranks(world_size, compressed_allreduce_cases)
    for rank, (failures, _) in enumerate(reports):
        assert failures == [], f"rank {rank} got wrong results for {failures}"
    assert all(digests == reports[0][1] for _, digests in reports), "ranks ended with different bits"


@pytest.mark.parametrize("world_size", [2, 3])
def test_allgatherv_concatenates_parts_of_any_length_in_rank_order(world_size):
    counts = [ALLGATHERV_COUNTS[(r + 1) % 3] for r in range(world_size)]
    expected = np.concatenate([np.arange(c, dtype=np.float32) + 1000 * r for r, c in enumerate(counts)])
    expected_pairs = [[r, r] for r, c in enumerate(counts) for _ in range(c % 7)]
    for rank, (digest, pairs) in enumerate(run_ranks(world_size, allgatherv_parts)):
        assert digest == hashlib.sha256(expected.tobytes()).hexdigest(), f"rank {rank} gathered other values"
        assert pairs == expected_pairs


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_alltoallv_delivers_each_ranks_part_to_its_destination_whatever_its_length(world_size):
    for rank, digests in enumerate(run_ranks(world_size, alltoallv_parts)):
        expected = [alltoall_part(s, rank, dtype) for dtype in (np.float32, np.int64) for s in range(world_size)]
        assert digests == [hashlib.sha256(part.tobytes()).hexdigest() for part in expected], f"rank {rank}"


def test_alltoallv_checks_its_parts_against_the_counts():
    with Communicator.from_peers(0, ["127.0.0.1:1"], b"s" * 32) as alone:
        assert alone.alltoallv([np.arange(3.0, dtype=np.float32)], [[3]])[0].tolist() == [0.0, 1.0, 2.0]
        with pytest.raises(ValueError, match=r"rank 0's parts have \[3\] elements, but its row of counts is \[2\]"):
            alone.alltoallv([np.arange(3, dtype=np.int64)], [[2]])
        with pytest.raises(TypeError, match="share one of"):
            alone.alltoallv([np.arange(3, dtype=np.int8)], [[3]])


def test_broadcast_allgather_object_and_barrier():
    entered = CONTEXT.Value("i", 0)
    reports = run_ranks(3, broadcast_gather_barrier, last_rank_entered=entered)
    expected_gather = [{"rank": r, "text": "é" * r, "list": [r, None]} for r in range(3)]
    for rank, (floats_ok, small, gathered, seen, comm_rank, world_size) in enumerate(reports):
        assert floats_ok, f"rank {rank} did not receive root's buffer"
        assert small == [0] * 7
        assert gathered == expected_gather
        assert seen == 1, f"rank {rank} left the barrier before the last rank entered it"
        assert (comm_rank, world_size) == (rank, 3)


def test_dead_rank_fails_its_peers_at_once_naming_it():
    started = CONTEXT.Event()
    with Ranks(3, allreduce_until_failure, started=started) as ranks:
        ranks.connect()
        assert started.wait(JOIN_SECONDS)
        ranks.processes[2].kill()
        reports = ranks.results(count=2)
    for rank in (0, 1):
        (message, elapsed, reused), error, threads = reports[rank]
        assert error is None, error
        assert "rank 2" in message, f"rank {rank}: {message}"
        assert elapsed < 10, f"rank {rank} took {elapsed:.1f} s to notice (timeout 30 s)"
        assert "failed earlier" in reused
        assert threads == []


def test_silent_rank_times_out_naming_it():
    released = CONTEXT.Event()
    with Ranks(3, silent_peer, released=released) as ranks:
        ranks.connect()
        reports = ranks.results(count=2)
        released.set()
        assert ranks.results(count=1)[2][1] is None
    for rank in (0, 1):
        (message, elapsed, threads), error, _ = reports[rank]
        assert error is None, error
        assert "rank 2 sent nothing for 2 s" in message, f"rank {rank}: {message}"
        assert 1.5 <= elapsed < 10
        assert threads == []


def test_absent_rank_fails_the_rendezvous_naming_it():
    released = CONTEXT.Event()
    message, elapsed, threads = run_ranks(2, absent_peer, released=released)[0]
    assert "rank 1" in message, message
    assert elapsed < 10
    assert threads == []


def test_mismatched_buffer_sizes_raise_on_every_rank():
    for message in run_ranks(2, mismatched_sizes):
        assert "same size" in message, message


def _forge_client(address, connected, claimed_rank, world_size):
    """Speak the handshake format but answer with a made-up MAC; return what the server sends after it."""
    with socket.create_connection(address, timeout=JOIN_SECONDS) as sock:
        connected.set()
        sock.sendall(struct.pack("!4sII", b"STFC", world_size, claimed_rank) + secrets.token_bytes(32))
        reply = b""
        while len(reply) < 72:
            reply += sock.recv(72 - len(reply))
        sock.sendall(secrets.token_bytes(32))
        return sock.recv(2)


def test_wrong_secret_is_refused_while_real_peers_complete():
    outcomes = {}

    def wrong_secret(address, connected):
        with socket.create_connection(address, timeout=JOIN_SECONDS) as sock:
            connected.set()
            try:
                client_handshake(sock, secrets.token_bytes(32), 0, 1, 2)
                outcomes["wrong secret"] = "accepted"
            except HandshakeError as exc:
                outcomes["wrong secret"] = str(exc)

    def forged_mac(address, connected):
        outcomes["forged mac"] = _forge_client(address, connected, 0, 2)

    with Ranks(2, one_allreduce) as ranks:
        target = parse_peer(ranks.peers[1])
        connected = [threading.Event(), threading.Event()]
        intruders = [threading.Thread(target=f, args=(target, event))
                     for f, event in zip((wrong_secret, forged_mac), connected)]
        for intruder in intruders:
            intruder.start()
        assert all(event.wait(JOIN_SECONDS) for event in connected)
        ranks.connect()  # the real rank 0 queues up behind the intruders
        reports = ranks.results()
        for intruder in intruders:
            intruder.join(JOIN_SECONDS)
    assert "did not prove it knows the job secret" in outcomes["wrong secret"]
    assert outcomes["forged mac"] == b"", "the server answered a client that forged its MAC"
    for rank in (0, 1):
        value, error, _ = reports[rank]
        assert error is None, error
        assert value == [3] * 5


def test_world_size_one_is_a_no_op_without_sockets():
    open_files = set(os.listdir("/proc/self/fd"))
    threads = set(threading.enumerate())  # threads of earlier tests may still end meanwhile: compare identities
    with Communicator.from_peers(0, ["127.0.0.1:0"], secrets.token_bytes(32)) as comm:
        buffer = np.arange(5, dtype=np.int32)
        assert comm.allreduce(buffer) is buffer and buffer.tolist() == [0, 1, 2, 3, 4]
        comm.broadcast(buffer)
        comm.barrier()
        assert comm.allgather_object((1, "a")) == [[1, "a"]]
        assert (comm.rank, comm.world_size) == (0, 1)
        assert set(os.listdir("/proc/self/fd")) <= open_files
        assert set(threading.enumerate()) <= threads
    with pytest.raises(CollectiveError, match="closed"):
        comm.barrier()


@pytest.mark.parametrize("buffer, error", [
    (np.ones(3, dtype=np.float16), TypeError),
    (np.ones((4, 4), dtype=np.float32)[:, 1], ValueError),
    ([1.0, 2.0], TypeError),
])
def test_bad_buffers_are_rejected(buffer, error):
    with Communicator.from_peers(0, ["127.0.0.1:0"], secrets.token_bytes(32)) as comm:
        with pytest.raises(error):
            comm.allreduce(buffer)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        Communicator.from_peers(0, ["127.0.0.1:0"], b"short")
    with pytest.raises(TypeError, match="must be bytes"):
        Communicator.from_peers(0, ["127.0.0.1:0"], "a text secret of some length")
    with pytest.raises(ValueError, match="timeout must be a positive"):
        Communicator.from_peers(0, ["127.0.0.1:0"], secrets.token_bytes(32), timeout=0)
    with Communicator.from_peers(0, ["127.0.0.1:0"], secrets.token_bytes(32)) as comm:
        with pytest.raises(ValueError, match="op must be"):
            comm.allreduce(np.ones(2), op="max")
        with pytest.raises(ValueError, match="'bf16' or 'fp16', got 'int8'"):
            comm.allreduce(np.ones(2), compression="int8")
        with pytest.raises(ValueError, match="root"):
            comm.broadcast(np.ones(2), root=1)


def dropped_without_close(rank, peers, listener, secret):
    """A communicator that is garbage-collected without close() must not leave its thread behind."""
    comm = Communicator.from_peers(rank, peers, secret, timeout=30, listener=listener)
    comm.barrier()
    running = collective_threads()
    del comm
    return running


def test_dropped_communicator_ends_its_thread():
    for running in run_ranks(2, dropped_without_close):  # run_ranks checks no thread is left
        assert len(running) == 1 and running[0].startswith("sparktf-collective-sender")


def test_small_frames_leave_from_the_posting_thread_and_large_ones_from_the_sender():
    from sparktf.collective.sender import INLINE_FRAME_BYTES, FrameSender
    from sparktf.collective.transport import DATA, HEADER, FrameHeader, PeerFailure, recv_exact

    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    theirs.settimeout(5)
    sender = FrameSender(ours, 1, on_error=lambda: None, name="sparktf-collective-sender-test")
    try:
        small, large = b"s" * INLINE_FRAME_BYTES, b"L" * (INLINE_FRAME_BYTES + 1)
        for payload in (small, large, small):  # the second small one queues behind the large one: order kept
            sender.post(FrameHeader(DATA, 7, 1, len(payload)), memoryview(payload))
        assert sender._posted == 2  # only the first small frame skipped the queue
        for payload in (small, large, small):
            header, received = bytearray(HEADER.size), bytearray(len(payload))
            assert recv_exact(theirs, memoryview(header))
            assert FrameHeader.unpack(header).length == len(payload)
            assert recv_exact(theirs, memoryview(received)) and received == payload
        sender.flush(5)
        theirs.close()
        with pytest.raises(PeerFailure, match="rank 1"):  # a send to a closed peer fails the post itself
            for _ in range(100):
                sender.post(FrameHeader(DATA, 7, 2, len(small)), memoryview(small))
    finally:
        sender.stop(1)
        ours.close()



def _connected_pair():
    with socket.create_server(("127.0.0.1", 0)) as server:
        near = socket.create_connection(server.getsockname(), timeout=JOIN_SECONDS)
        far, _ = server.accept()
    return near, far


def test_a_left_neighbour_that_closed_is_named_even_after_a_send_to_the_right_failed():
    """Rank 2 dies, rank 1 aborts over it and closes, and only then does rank 0 read: it must name rank 2."""
    from sparktf.collective.link import RingLink
    from sparktf.collective.transport import PeerFailure

    left, left_peer = _connected_pair()
    right, right_peer = _connected_pair()
    link = RingLink(0, 3, left, right, timeout=JOIN_SECONDS)
    try:
        right_peer.close()  # rank 1 is gone: the frames posted to it fail
        left_peer.close()  # rank 2 closed without an abort notice
        link.begin(1)
        link.post(memoryview(bytearray(8 << 20)))
        with pytest.raises(PeerFailure, match="rank 1"):
            link.flush()
        with pytest.raises(PeerFailure) as failure:
            link.receive_into(memoryview(bytearray(16)))
        assert failure.value.rank == 2
        assert "rank 2 closed its connection" in str(failure.value) and "sending to rank 1 failed too" in str(failure.value)
    finally:
        link.close()
