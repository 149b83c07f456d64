"""Socket options and the frame format spoken on an authenticated ring link.

Every message is one frame: a 16-byte header followed by ``length`` payload
bytes.  The header says what the frame is (data or an abort notice), which
collective call it belongs to (a per-communicator sequence number and a tag
naming the collective and dtype) and how long it is, so a rank that calls a
different collective, or the same one with another size or dtype, is caught
at the first frame instead of silently mixing bytes.

Payloads are raw array bytes or UTF-8 JSON; nothing read from a socket is ever
unpickled.
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass

from sparktf.errors import CollectiveError

__all__ = [
    "ABORT", "DATA", "HEADER", "FrameHeader", "PeerFailure", "configure_socket",
    "decode_abort", "encode_abort", "recv_exact", "send_frame",
]

HEADER = struct.Struct("!BxHIQ")  # kind, tag, sequence number, payload length
DATA = 1
ABORT = 2
SOCKET_BUFFER_BYTES = 4 << 20
_MAX_ABORT_BYTES = 64 << 10


class PeerFailure(CollectiveError):
    """A collective failed because of one peer.

    ``rank`` names that peer and ``reason`` says what happened to it, without
    the note of which rank passed the news on.
    """

    def __init__(self, rank: int, message: str, reason: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.reason = reason or message


@dataclass(frozen=True)
class FrameHeader:
    """The decoded header of one frame."""

    kind: int
    tag: int
    seq: int
    length: int

    def pack(self) -> bytes:
        return HEADER.pack(self.kind, self.tag, self.seq, self.length)

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> "FrameHeader":
        return cls(*HEADER.unpack(data))


def configure_socket(sock: socket.socket, timeout: float) -> None:
    """Set the options every ring socket uses: no Nagle delay, big buffers, a timeout.

    A buffer size is only set when the kernel allows the full
    ``SOCKET_BUFFER_BYTES``: on Linux a smaller explicit size (capped by
    ``net.core.wmem_max`` / ``rmem_max``) would switch off the kernel's own
    buffer growth, which reaches several MiB by itself.
    """
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option, limit in ((socket.SO_SNDBUF, "wmem_max"), (socket.SO_RCVBUF, "rmem_max")):
        if _kernel_allows(limit) and sock.getsockopt(socket.SOL_SOCKET, option) < SOCKET_BUFFER_BYTES:
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
    sock.settimeout(timeout)


def _kernel_allows(limit: str) -> bool:
    try:
        with open(f"/proc/sys/net/core/{limit}") as setting:
            return int(setting.read()) >= SOCKET_BUFFER_BYTES
    except (OSError, ValueError):  # not Linux: the size asked for is the size given
        return True


def recv_exact(sock: socket.socket, view: memoryview) -> bool:
    """Fill the byte ``view`` from ``sock``; return False if the peer closed first."""
    while view.nbytes:
        received = sock.recv_into(view)
        if not received:
            return False
        view = view[received:]
    return True


def send_frame(sock: socket.socket, header: FrameHeader, payload: memoryview) -> None:
    """Send a header and its payload, usually in a single system call."""
    head = header.pack()
    sent = sock.sendmsg([head, payload])
    if sent < len(head):
        sock.sendall(head[sent:])
        sent = len(head)
    if sent - len(head) < payload.nbytes:
        sock.sendall(payload[sent - len(head):])


def encode_abort(rank: int, reason: str) -> bytes:
    """The payload of an abort notice blaming ``rank``."""
    return json.dumps({"rank": rank, "reason": reason[:2000]}).encode()


def decode_abort(header: FrameHeader, sock: socket.socket, sender_rank: int) -> PeerFailure:
    """Read an abort notice's payload and turn it into the error to raise."""
    if header.length > _MAX_ABORT_BYTES:
        return PeerFailure(sender_rank, f"rank {sender_rank} sent an oversized abort notice ({header.length} bytes)")
    payload = bytearray(header.length)
    if not recv_exact(sock, memoryview(payload)):
        return PeerFailure(sender_rank, f"rank {sender_rank} aborted the collective and closed its connection")
    try:
        notice = json.loads(payload)
        culprit, reason = int(notice["rank"]), str(notice["reason"])
    except (ValueError, KeyError, TypeError):
        return PeerFailure(sender_rank, f"rank {sender_rank} sent a malformed abort notice")
    return PeerFailure(culprit, f"{reason} (reported to this rank by rank {sender_rank})", reason)
