"""A rank's side of the job channel: registering its ring address, moving state, and its heartbeat.

The :class:`Heartbeat` also guards the task: when the driver shuts the
channel (the job failed, was cancelled, or the driver is gone) while this
task is still running, the task is garbage. Spark cancels barrier tasks
without interrupting them, and a Python worker stuck in a TensorFlow op or a
sleep would keep its executor slot, so a later job waits for it forever. The
heartbeat ends such a worker process ``GUARD_GRACE_SECONDS`` after the
channel closed.
"""

from __future__ import annotations

import itertools
import linecache
import os
import select
import socket
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from sparktf.collective.auth import HandshakeError, client_handshake
from sparktf.collective.channel_wire import ChannelClosed, recv_message, send_message
from sparktf.collective.rendezvous import HANDSHAKE_SECONDS, checked_claim, connect_before, parse_peer
from sparktf.errors import CollectiveError, FailureRecord

__all__ = ["ChannelClient", "directory_peers", "Heartbeat", "NoHeartbeat", "start_heartbeat", "HEARTBEAT_SECONDS",
           "GUARD_GRACE_SECONDS", "MAX_REPORTED_BATCHES", "DONE", "IDLE"]

HEARTBEAT_SECONDS = 1.0
#: The phase a task reports last: it is finished, not stalled (the driver's watchdog waits for no more).
DONE = "done"
#: The phase of a rank of a resident job waiting for the driver's next order: waiting on the driver, not stuck.
IDLE = "idle"

#: A rank in the same phase and iteration this long (at most a fifth of the collective timeout) sends its task thread's
#: stack with each report.
STACK_AFTER_SECONDS = 5.0
_STACK_FRAMES = 30
_STACK_LINE_CHARS = 300
MAX_REPORTED_BATCHES = 256  # iterations one report carries at most; a full backlog is sent at once
_REPORT_BATCH_CHARS = 32 << 10  # their share of a report's header (channel_wire.MAX_HEADER_BYTES: 64 KiB)
_MAX_QUEUED_BATCHES = 8192  # not sent yet (a stalled connection): the oldest are dropped beyond that
GUARD_GRACE_SECONDS = 3.0  # a task still running then is stuck: a failed job's others raise at their next collective


class ChannelClient:
    """An authenticated connection from ``rank`` to the job channel at ``address``.

    Raises
    ------
    CollectiveError
        The channel could not be reached within ``connect_timeout`` or did
        not authenticate.
    """

    def __init__(self, address: str, rank: int, world_size: int, secret: bytes, connect_timeout: float):
        self.address = address
        self.rank = rank
        try:
            self.sock = connect_before(parse_peer(address), time.monotonic() + connect_timeout)
        except OSError as exc:
            raise CollectiveError(
                f"could not reach sparktf's job channel (peer directory) on the driver at {address} ({exc}); "
                "executors must be able to open TCP connections to spark.driver.host, or set "
                "spark.sparktf.rendezvous=barrier to exchange addresses through Spark "
                "(about 1 s slower per training job)") from None
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms Nagle wait per message
            self.sock.settimeout(HANDSHAKE_SECONDS)
            client_handshake(self.sock, secret, rank, world_size, world_size)
        except (HandshakeError, OSError) as exc:
            self.sock.close()
            raise CollectiveError(
                f"rank {rank} could not authenticate with the peer directory at {address}: {exc}") from None

    def request(self, header: Dict[str, Any], timeout: float, arrays: Sequence[np.ndarray] = (),
                what: str = "the job channel") -> Tuple[Dict[str, Any], List[np.ndarray]]:
        """Send a message and wait at most ``timeout`` seconds between bytes of the answer."""
        self.sock.settimeout(timeout)
        try:
            send_message(self.sock, header, arrays)
            answer, answer_arrays = recv_message(self.sock)
        except TimeoutError:
            raise CollectiveError(f"rank {self.rank}: {what} at {self.address} did not answer within "
                                  f"{timeout:g} s") from None
        except (OSError, ValueError) as exc:
            raise CollectiveError(f"rank {self.rank}: {what} at {self.address} failed: {exc}") from None
        if "error" in answer:
            raise CollectiveError(f"rank {self.rank}: {what} at {self.address} refused: {answer['error']}")
        return answer, answer_arrays

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "ChannelClient":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


def directory_peers(directory: str, rank: int, world_size: int, peer: str, secret: bytes,
                    connect_timeout: float, timeout: float,
                    claim: Optional[int] = None) -> Tuple[List[str], List[Optional[int]]]:
    """Register ``peer`` (this rank's ring address) and ``claim`` with the job channel.

    Returns
    -------
    (peers, claims)
        Every rank's address and claim, by rank.

    Raises
    ------
    CollectiveError
        The channel could not be reached or did not authenticate, or the
        other ranks did not register within ``timeout``.
    """
    with ChannelClient(directory, rank, world_size, secret, connect_timeout) as client:
        client.sock.settimeout(timeout)
        try:
            send_message(client.sock, {"op": "register", "peer": peer, "claim": claim})
            answer, _ = recv_message(client.sock)
        except TimeoutError:
            raise CollectiveError(
                f"rank {rank}: not every one of the {world_size} ranks registered with the peer directory "
                f"within {timeout:g} s; check that every task started") from None
        except (OSError, ValueError) as exc:
            raise CollectiveError(f"rank {rank}: the peer directory at {directory} failed: {exc}") from None
    peers, claims = answer.get("peers"), answer.get("claims")
    try:
        if not isinstance(peers, list) or not isinstance(claims, list) or not len(peers) == len(claims) == world_size:
            raise ValueError("not one peer and one claim per rank")
        return [str(entry) for entry in peers], [checked_claim(claim, world_size) for claim in claims]
    except ValueError:
        raise CollectiveError(f"rank {rank}: the peer directory at {directory} sent a malformed answer") from None


class Heartbeat:
    """Reports this rank's phase and iteration to the driver every ``HEARTBEAT_SECONDS``, and guards the task.

    A report also carries what ``step_window()`` returns (a summary of the
    step timings since the previous report, or None), and the values (loss,
    metrics) of the iterations queued with :meth:`add_batch` since the
    previous report, at most
    ``MAX_REPORTED_BATCHES`` (fewer for many values per iteration, to keep
    the header small); a queue of that many is sent at once, without
    waiting for the next beat.

    Parameters
    ----------
    client : ChannelClient
        A connection of its own (reports are one-way).
    exit_when_orphaned : bool
        End this process when the channel closes and :meth:`stop` is not
        called within ``GUARD_GRACE_SECONDS`` (True in a Spark task).
    """

    def __init__(self, client: ChannelClient, exit_when_orphaned: bool = True):
        self._client = client
        self._exit_when_orphaned = exit_when_orphaned
        self.phase = "start"
        self.iteration = 0
        self.loss: Optional[float] = None
        self._watched = threading.get_ident()  # the task's thread: its stack goes with the reports of a long phase
        self._unchanged: Tuple[Any, float] = ((self.phase, self.iteration), time.monotonic())
        self.stack_after = STACK_AFTER_SECONDS
        self._waiting_stack: Optional[List[str]] = None  # the task thread's stack, taken while its phase was long
        self._batch_names: Tuple[str, ...] = ()
        self._batches: Deque[Tuple[int, List[float]]] = deque(maxlen=_MAX_QUEUED_BATCHES)
        self._per_report = MAX_REPORTED_BATCHES
        self.step_window: Callable[[], Optional[Dict[str, Any]]] = _nothing
        self._stopped = threading.Event()
        self._wake, self._waker = socket.socketpair()  # stop() wakes the thread from its wait at once
        self._thread = threading.Thread(target=self._run, name="sparktf-heartbeat", daemon=True)
        self._thread.start()

    def set_batch_names(self, names: Sequence[str]) -> None:
        """Name the values :meth:`add_batch` takes, e.g. ``("loss", "accuracy")``.

        Names too long to travel in every report turn the per-iteration
        values off (the driver then gets them with the segment's result).
        """
        names = tuple(str(name) for name in names)
        fits = 0 < len(names) and sum(len(name) + 4 for name in names) <= _REPORT_BATCH_CHARS // 4
        self._batch_names = names if fits else ()
        self._per_report = max(1, min(MAX_REPORTED_BATCHES, _REPORT_BATCH_CHARS // (26 * len(names) + 4)))

    def add_batch(self, iteration: int, values: Sequence[float]) -> None:
        """Queue one iteration's values (in :meth:`set_batch_names` order) for the next report.

        Iterations are queued in order, one after the other; a full report's
        worth wakes the heartbeat to send it at once.
        """
        if not self._batch_names:
            return
        self._batches.append((int(iteration), [float(value) for value in values]))
        if len(self._batches) == self._per_report and not self._stopped.is_set():
            self._waker.send(b".")

    def stop(self, final_phase: Optional[str] = None, failure: Optional[FailureRecord] = None) -> None:
        """The task is done with the channel: stop reporting and close the connection.

        ``final_phase``, if given, is reported last (e.g. ``"done"``: the task
        finished, which the driver's watchdog tells apart from a stall), and
        so is ``failure``: why the task failed, when it knows.
        """
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._waker.send(b"!")
        self._thread.join(timeout=HANDSHAKE_SECONDS)
        if (final_phase is not None or failure is not None) and not self._thread.is_alive():
            self.phase = final_phase or self.phase
            try:
                self._report(failure)
            except (OSError, ValueError, CollectiveError):  # the driver is gone: nobody is watching
                pass
        self._client.close()
        self._wake.close()
        self._waker.close()

    def _report(self, failure: Optional[FailureRecord] = None) -> None:
        header = {"op": "report", "phase": self.phase, "iteration": int(self.iteration), "loss": self.loss}
        now, state = time.monotonic(), (self.phase, int(self.iteration))
        if state != self._unchanged[0]:
            self._unchanged, self._waiting_stack = (state, now), None
        elif threading.get_ident() == self._watched:  # the task's failure report: where it waited, not this code
            header["stack"] = self._waiting_stack
        elif now - self._unchanged[1] >= self.stack_after:
            header["stack"] = self._waiting_stack = thread_stack(self._watched)
        if failure is not None:
            header["failure"] = failure.to_wire()
        window = self.step_window()
        if window is not None:
            header["steps"] = window
        rows = [self._batches.popleft() for _ in range(min(self._per_report, len(self._batches)))]
        if rows:
            header["batches"] = {"first": rows[0][0], "names": list(self._batch_names),
                                 "values": [values for _, values in rows]}
        if failure is None:
            send_message(self._client.sock, header)
        else:  # acknowledged: the driver holds the record before this task fails in Spark
            self._client.request(header, HANDSHAKE_SECONDS, what="reporting the task's failure")

    def _run(self) -> None:
        sock = self._client.sock
        sock.settimeout(HANDSHAKE_SECONDS)
        while not self._stopped.is_set():
            try:
                self._report()
                if len(self._batches) >= self._per_report:  # more than one report's worth queued
                    continue
                readable, _, _ = select.select([sock, self._wake], [], [], HEARTBEAT_SECONDS)
                if self._wake in readable:  # add_batch's wake-up, or stop()
                    self._wake.recv(64)
                if sock in readable and not sock.recv(1):  # the driver sends nothing here: readable means closed
                    raise ChannelClosed("the driver closed the job channel")
            except (OSError, ValueError):
                self._orphaned()
                return

    def _orphaned(self) -> None:
        """The driver is done with this job: if the task does not end soon, end its process."""
        if self._stopped.wait(GUARD_GRACE_SECONDS) or not self._exit_when_orphaned:
            return
        sys.stderr.write(
            f"sparktf: rank {self._client.rank}'s job is over on the driver but this task is still in phase "
            f"{self.phase!r} (iteration {self.iteration}) after {GUARD_GRACE_SECONDS:g} s; ending its Python "
            "worker so that the executor's task slot is freed\n")
        sys.stderr.flush()
        os._exit(70)


def thread_stack(ident: int) -> List[str]:
    """The innermost frames of thread ``ident`` (outermost first), one ``"file:line in function: code"`` each, then
    those of the process's other threads running Python (e.g. a ``tf.py_function`` the task thread waits for), each
    after a ``"# thread <name>"`` line; the calling thread's own are left out."""
    frames = sys._current_frames()
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    lines = _frames(frames.get(ident), _STACK_FRAMES)
    for other, frame in frames.items():
        if other not in (ident, threading.get_ident()):
            shown = _frames(frame, _STACK_FRAMES // 3)
            if shown and not any(idle in shown[-1] for idle in _IDLE):
                lines += [f"# thread {names.get(other, other)}"] + shown
    return lines


#: Where a thread that waits for work is (not worth showing).
_IDLE = ("threading.py", "selectors.py", "queue.py", "socket.py", "channel_client.py")


def _frames(frame: Any, limit: int) -> List[str]:
    """The ``limit`` innermost frames from ``frame`` (outermost first). Code without a file of its own (a function
    AutoGraph converted: ``<dynamic-code>``, its lines the original's) is named by the file of the module it runs
    in."""
    if frame is None:
        return []
    lines = []
    for entry, lineno in reversed(list(itertools.islice(traceback.walk_stack(frame), limit))):
        code = entry.f_code
        where = code.co_filename
        if where.startswith("<") and entry.f_globals.get("__file__"):
            where = entry.f_globals["__file__"]
        text = linecache.getline(where, lineno).strip()
        lines.append(f"{where}:{lineno} in {code.co_name}: {text}"[:_STACK_LINE_CHARS])
    return lines


def _nothing() -> None:
    return None


class NoHeartbeat:
    """Stands in for the :class:`Heartbeat` when there is no job channel."""

    phase = "start"
    iteration = 0
    loss = None

    def set_batch_names(self, names: Sequence[str]) -> None:
        pass

    def add_batch(self, iteration: int, values: Sequence[float]) -> None:
        pass

    def stop(self, final_phase: Optional[str] = None, failure: Optional[FailureRecord] = None) -> None:
        pass


def start_heartbeat(address: Optional[str], rank: int, world_size: int, secret: bytes,
                    connect_timeout: float) -> Any:
    """A :class:`Heartbeat` to the job channel at ``address``, or a :class:`NoHeartbeat` without one."""
    if address is None:
        return NoHeartbeat()
    heartbeat = Heartbeat(ChannelClient(address, rank, world_size, secret, connect_timeout))
    heartbeat.stack_after = min(STACK_AFTER_SECONDS, connect_timeout / 5)  # well before a peer gives up on it
    return heartbeat
