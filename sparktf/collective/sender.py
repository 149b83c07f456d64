"""The background thread that writes frames to the right-hand ring neighbour.

Sending runs on its own thread so that a rank can push segment ``k`` to its
right neighbour while it receives and reduces segment ``k + 1`` from its left
neighbour: both directions of every link are busy at once.  Frames are sent
in the order they are posted.

A small frame posted while nothing is queued is sent at once from the posting
thread instead, which spares the hand-off to the sender thread and back (a
2-rank all-reduce of 4-64 KiB on loopback: 180-265 us -> 54-89 us, the raw
socket's time).  That cannot deadlock: the ring algorithms post a frame only
after receiving one (each rank's first frames aside), so the whole ring holds
at most about one unread frame per rank, while a blocked send needs a full
TCP receive buffer (64 KiB or more; Linux's default 128 KiB) on every link of
a cycle.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Callable

from sparktf.collective.transport import FrameHeader, PeerFailure, send_frame

__all__ = ["FrameSender"]

_STOP = object()

#: Frames of at most this many payload bytes go out from the posting thread when nothing is queued.
INLINE_FRAME_BYTES = 32 * 1024


class FrameSender:
    """Send posted frames on ``sock`` from a dedicated thread.

    After the first failure the thread keeps draining the queue without
    sending (so ``flush`` never waits for it), records the error in
    ``error`` and calls ``on_error`` once, to wake the receiving thread.

    ``send_seconds`` adds up the time spent sending the frames that started
    while ``counting`` was set (see ``RingLink.time_sends``).
    """

    def __init__(self, sock: socket.socket, peer_rank: int, on_error: Callable[[], None], name: str):
        self._sock = sock
        self._peer_rank = peer_rank
        self._on_error = on_error
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._posted = 0  # frames queued; written by the posting thread only
        self._sent = 0  # frames handled; written by the sender thread only
        self._stopping = False
        self.error: PeerFailure | None = None
        self.counting = False
        self.send_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def post(self, header: FrameHeader, payload: memoryview) -> None:
        """Send one frame: a small one at once if nothing is queued, else queue it (``payload`` must then not
        change until ``flush`` returns); raise the sending error if any."""
        if payload.nbytes <= INLINE_FRAME_BYTES and self._sent == self._posted:
            if self.error is None:
                self._send(header, payload)
            if self.error is not None:
                raise self.error
            return
        self._posted += 1
        self._queue.put((header, payload))

    def flush(self, timeout: float) -> None:
        """Wait until every posted frame is sent (no hand-off if it already is); raise the sending error if any."""
        if self._sent != self._posted:
            done = threading.Event()
            self._queue.put(done)
            if not done.wait(timeout):
                raise PeerFailure(self._peer_rank, f"rank {self._peer_rank} accepted no data for {timeout:g} s")
        if self.error is not None:
            raise self.error

    def stop(self, grace: float) -> bool:
        """Drop queued frames and end the thread; return False if a send is still blocked after ``grace``."""
        self._stopping = True
        self._queue.put(_STOP)
        self._thread.join(grace)
        return not self._thread.is_alive()

    def join(self) -> None:
        """Wait for the thread to end (after ``stop`` and after the socket was shut down)."""
        self._thread.join()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            if self.error is None and not self._stopping:
                self._send(*item)
            self._sent += 1

    def _send(self, header: FrameHeader, payload: memoryview) -> None:
        counted, started = self.counting, time.perf_counter()
        try:
            send_frame(self._sock, header, payload)
            if counted:
                self.send_seconds += time.perf_counter() - started
        except TimeoutError:
            self._fail(f"rank {self._peer_rank} accepted no data for {self._sock.gettimeout():g} s; "
                       "it is stuck or overloaded (raise collective_timeout if it is only slow)")
        except OSError as exc:
            self._fail(f"sending to rank {self._peer_rank} failed ({exc}); it probably failed: check its log")

    def _fail(self, message: str) -> None:
        if self._stopping:
            return
        self.error = PeerFailure(self._peer_rank, message)
        self._on_error()
