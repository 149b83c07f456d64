"""One rank's two ring connections: frames go out to the right, come in from the left."""

from __future__ import annotations

import logging
import socket
import time
from typing import NamedTuple

from sparktf.collective.sender import FrameSender
from sparktf.collective.transport import (
    ABORT, DATA, HEADER, FrameHeader, PeerFailure, decode_abort, encode_abort, recv_exact,
)

__all__ = ["RingLink", "WireSeconds"]

logger = logging.getLogger(__name__)

_GRACE_SECONDS = 1.0  # how long a frame being sent may take to finish when stopping


class WireSeconds(NamedTuple):
    """Seconds of a rank's ring traffic over the calls so far (see :attr:`RingLink.wire_seconds`)."""

    send: float
    receive: float
    waited: float


class RingLink:
    """Framed, overlapped I/O on the ring: ``post`` to the right, ``receive`` from the left.

    Parameters
    ----------
    rank, world_size : int
        This rank and the ring size.
    left, right : socket.socket
        Authenticated sockets from the left neighbour and to the right one.
    timeout : float
        Seconds a peer may stay silent before the collective fails.
    """

    def __init__(self, rank: int, world_size: int, left: socket.socket, right: socket.socket, timeout: float):
        self.rank = rank
        self.left_rank = (rank - 1) % world_size
        self.right_rank = (rank + 1) % world_size
        self.timeout = timeout
        self._left = left
        self._right = right
        self._header = bytearray(HEADER.size)
        self._tag = 0
        self._seq = 0
        self._frames_this_call = 0
        self._receive_seconds = 0.0  # receiving frames' bodies
        self._waited_seconds = 0.0  # receiving frames, from asking for their header
        self._sender = FrameSender(right, self.right_rank, self._wake_receiver,
                                   name=f"sparktf-collective-sender-rank{rank}")

    def begin(self, tag: int) -> None:
        """Start a new collective call; its frames carry ``tag`` and a new sequence number."""
        self._tag = tag
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        self._frames_this_call = 0
        self._sender.counting = False

    def time_sends(self) -> None:
        """Count the time of this call's sends from here on in :attr:`wire_seconds` (see there)."""
        self._sender.counting = True

    @property
    def wire_seconds(self) -> WireSeconds:
        """Seconds over the calls so far.

        ``send``: this rank's sends, from each call's :meth:`time_sends` on (an
        all-reduce starts counting once every rank has taken part; before that,
        a send may only wait for a late peer). ``receive``: receiving the left
        neighbour's frames after their headers came. A frame goes out whole, so
        from its header on only the link (or the left's sending) sets how long
        its bytes take: a slow link shows at the receiver even when the
        sender's socket buffer took the frame at once and its sends look fast,
        and a late peer (the wait before a header) does not. ``waited``:
        receiving the left neighbour's frames from asking for each one: all
        this rank waited for it (its lateness, its slowness inside the call,
        the link).
        """
        return WireSeconds(self._sender.send_seconds, self._receive_seconds, self._waited_seconds)

    def post(self, payload: memoryview) -> None:
        """Queue ``payload`` (bytes) for the right neighbour; keep it unchanged until ``flush``."""
        self._sender.post(FrameHeader(DATA, self._tag, self._seq, payload.nbytes), payload)

    def receive_into(self, payload: memoryview) -> None:
        """Receive the next frame from the left neighbour into ``payload``, which must fit it exactly."""
        asked = time.perf_counter()
        self._receive_header(payload.nbytes, payload.nbytes)
        self._receive_body(payload, asked)

    def receive_bytes(self, limit: int) -> bytes:
        """Receive the next frame from the left neighbour, of at most ``limit`` bytes."""
        asked = time.perf_counter()
        payload = bytearray(self._receive_header(0, limit))
        self._receive_body(memoryview(payload), asked)
        return bytes(payload)

    def flush(self) -> None:
        """Wait until everything posted has been sent."""
        self._sender.flush(self.timeout)

    def abort(self, error: BaseException) -> None:
        """Tell the right neighbour which rank failed (when the stream allows it), then close.

        The notice goes out even when the right neighbour is the culprit: it
        may be alive (a mismatched call) and then learns what went wrong.
        """
        if self._stop_sender():
            culprit = error.rank if isinstance(error, PeerFailure) else self.rank
            notice = encode_abort(culprit, error.reason if isinstance(error, PeerFailure)
                                  else f"rank {self.rank} failed: {error!r}")
            self._right.settimeout(_GRACE_SECONDS)
            try:
                self._right.sendall(FrameHeader(ABORT, 0, 0, len(notice)).pack() + notice)
            except OSError:
                logger.debug("rank %d could not send its abort notice to rank %d", self.rank, self.right_rank)
        self._close_sockets()

    def close(self) -> None:
        """End the sender thread and close both connections."""
        self._stop_sender()
        self._close_sockets()

    def _stop_sender(self) -> bool:
        """End the sender thread; return False if it had to be cut off in the middle of a frame."""
        if self._sender.stop(_GRACE_SECONDS):
            return True
        for sock in (self._left, self._right):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._sender.join()
        return False

    def _receive_header(self, minimum: int, maximum: int) -> int:
        header = self._read_header()
        if header.kind == ABORT:
            raise decode_abort(header, self._left, self.left_rank)
        if header.kind != DATA or header.tag != self._tag or header.seq != self._seq:
            raise PeerFailure(self.left_rank, (
                f"rank {self.left_rank} is in another collective call than rank {self.rank} "
                f"(tag {header.tag:#06x} call {header.seq}, expected tag {self._tag:#06x} call {self._seq}): "
                "every rank must call the same collectives in the same order, with the same dtype and compression"))
        if not minimum <= header.length <= maximum:
            raise PeerFailure(self.left_rank, (
                f"rank {self.left_rank} sent {header.length} bytes where rank {self.rank} expected "
                f"{minimum if minimum == maximum else f'at most {maximum}'}: every rank must pass "
                "buffers of the same size"))
        return header.length

    def _read_header(self) -> FrameHeader:
        """The next header; a left neighbour silent for ``timeout`` fails the call, naming the right rank.

        A left neighbour that sent nothing in this call is the silent one.  One
        that took part and then stopped is most likely waiting for a silent
        rank further left, whose right neighbour times out at about the same
        moment and sends an abort notice naming it: wait a moment more for
        that notice (or for the data, if the left was only slow).
        """
        try:
            self._receive_payload(memoryview(self._header))
        except TimeoutError:
            if not self._frames_this_call:
                raise self._silence() from None
            self._left.settimeout(_GRACE_SECONDS)
            try:
                self._receive_payload(memoryview(self._header))
            except TimeoutError:
                raise self._silence() from None
            finally:
                self._left.settimeout(self.timeout)
        self._frames_this_call += 1
        return FrameHeader.unpack(self._header)

    def _receive_body(self, view: memoryview, asked: float) -> None:
        """Fill ``view`` with the frame's body; the frame was asked for at ``asked`` (``perf_counter``)."""
        started = time.perf_counter()
        try:
            self._receive_payload(view)
        except TimeoutError:
            raise self._silence() from None
        ended = time.perf_counter()
        self._receive_seconds += ended - started
        self._waited_seconds += ended - asked

    def _silence(self) -> PeerFailure:
        return self._sender.error or PeerFailure(self.left_rank, (
            f"rank {self.left_rank} sent nothing for {self.timeout:g} s; it is stuck, slow or "
            "waiting for another rank (raise collective_timeout if it is only slow)"))

    def _receive_payload(self, view: memoryview) -> None:
        """Fill ``view`` from the left.

        A closed or broken connection raises ``PeerFailure``; silence raises ``TimeoutError``.
        """
        try:
            complete = recv_exact(self._left, view)
        except TimeoutError:
            raise
        except OSError as exc:
            raise self._left_ended(PeerFailure(self.left_rank, (
                f"the connection from rank {self.left_rank} failed ({exc}); it probably failed: "
                "check its log"))) from None
        if not complete:
            raise self._left_ended(PeerFailure(self.left_rank, (
                f"rank {self.left_rank} closed its connection in the middle of a collective; "
                "it probably failed: check its log")))

    def _left_ended(self, failure: PeerFailure) -> PeerFailure:
        """What to raise when the connection from the left ended.

        A failed send to the right wakes the receiver by ending its side of
        that connection: then the send's failure is the news, unless the left
        neighbour had closed the connection itself. A rank that fails closes
        its connections at once, while one that aborts because of another's
        failure sends its notice before it closes: so a left closed without
        notice names the left, even when the right stopped accepting meanwhile
        (it most likely aborted over the same failure).
        """
        sent = self._sender.error
        if sent is None:
            return failure
        if not _closed_by_peer(self._left):
            return sent
        return PeerFailure(self.left_rank, f"{failure} (sending to rank {sent.rank} failed too: {sent.reason})",
                           failure.reason)

    def _wake_receiver(self) -> None:
        try:
            self._left.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def _close_sockets(self) -> None:
        self._left.close()
        self._right.close()


_TCP_ESTABLISHED = 1


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the peer closed or reset ``sock``'s connection (its TCP state left ESTABLISHED; Linux only).

    Ending our own side for reading (``_wake_receiver``) leaves the state as
    it is; where the state cannot be read, False.
    """
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != _TCP_ESTABLISHED
    except (AttributeError, OSError):
        return False
