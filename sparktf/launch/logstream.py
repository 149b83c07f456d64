"""Child output and child failures to the driver: an authenticated TCP server on the driver, a client per task.

Protocol (nothing read from these sockets is ever unpickled):

1. the server sends a random nonce line;
2. the client answers ``HMAC-SHA256(secret, nonce)`` in hex; a wrong or late
   answer closes the connection;
3. the client sends frames: a kind byte, the payload's length (4 bytes, big
   endian, at most ``MAX_FRAME_BYTES``) and the payload, UTF-8 text:

   * ``L``: one line of a child's output, already prefixed with its role;
   * ``F``: the message of a failed child (:func:`sparktf.launch.failures.failure_message`);
     the server answers ``A`` once it holds it, so the task raises only after
     the driver knows why.

The secret is random per ``sparktf.run`` call and reaches the tasks inside
the Spark task closure.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import socket
import struct
import sys
import threading
import time
from typing import Callable, List, Optional, Tuple

from sparktf.collective.rendezvous import AcceptLoop

__all__ = ["LogServer", "LogClient"]

_LOG = logging.getLogger(__name__)
HANDSHAKE_TIMEOUT_S = 10.0
SEND_TIMEOUT_S = 30.0
MAX_LINE_BYTES = 64 * 1024
MAX_FRAME_BYTES = 1 << 20  # a line (MAX_LINE_BYTES plus its role) or a failure message (about 100 short lines)
_NONCE_LINE_BYTES = 200
_HEADER = struct.Struct(">cI")
_LINE, _FAILURE, _ACK = b"L", b"F", b"A"


def _answer(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, nonce, hashlib.sha256).hexdigest().encode("ascii")


def _read_exactly(reader, size: int) -> bytes:
    data = reader.read(size)  # a buffered read: short only at the end of the stream
    if len(data) != size:
        raise EOFError("the connection ended inside a frame")
    return data


class LogServer:
    """Receives the tasks' lines, handing each to ``sink``, and their failures, in a thread per connection.

    Parameters
    ----------
    host : str
        Address to listen on (the driver's ``spark.driver.host``).
    sink : callable
        Called with each received line (without its newline), from the
        connection's thread.
    """

    def __init__(self, host: str, sink: Callable[[str], None]) -> None:
        self.secret = secrets.token_bytes(32)
        self._sink = sink
        self._listener = socket.create_server((host, 0))
        self.address: Tuple[str, int] = (host, self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._connections: List[Tuple[socket.socket, threading.Thread]] = []
        self._failures: List[str] = []
        self._accepting = AcceptLoop(self._listener, self._accepted, "sparktf-run-log-accept").start()

    def _accepted(self, connection: socket.socket, address: object) -> None:
        thread = threading.Thread(target=self._serve, args=(connection,), name="sparktf-run-log", daemon=True)
        with self._lock:
            self._connections.append((connection, thread))
        thread.start()

    def _serve(self, connection: socket.socket) -> None:
        try:
            connection.settimeout(HANDSHAKE_TIMEOUT_S)
            reader = connection.makefile("rb")
            nonce = secrets.token_hex(32).encode("ascii")
            connection.sendall(nonce + b"\n")
            if not hmac.compare_digest(reader.readline(_NONCE_LINE_BYTES).strip(), _answer(self.secret, nonce)):
                _LOG.warning("sparktf.run: refused a log connection that did not prove the job's secret")
                return
            connection.settimeout(None)
            while True:
                header = reader.read(_HEADER.size)
                if not header:
                    return
                kind, size = _HEADER.unpack(header + _read_exactly(reader, _HEADER.size - len(header)))
                if kind not in (_LINE, _FAILURE) or size > MAX_FRAME_BYTES:
                    _LOG.warning("sparktf.run: closed a log connection that sent a malformed frame")
                    return
                text = _read_exactly(reader, size).decode("utf-8", "replace")
                if kind == _LINE:
                    self._sink(text)
                    continue
                with self._lock:
                    self._failures.append(text)
                connection.sendall(_ACK)
        except (OSError, EOFError):
            pass
        finally:
            connection.close()

    def failures(self) -> List[str]:
        """The failure messages the tasks sent, in the order they arrived."""
        with self._lock:
            return list(self._failures)

    def close(self, drain_timeout: float = 10.0) -> None:
        """Stop accepting, give open connections ``drain_timeout`` seconds to end, then cut them (once)."""
        if self._accepting.woken:
            return
        self._accepting.stop()
        self._listener.close()
        deadline = time.monotonic() + drain_timeout
        with self._lock:
            connections = list(self._connections)
        for connection, thread in connections:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                thread.join(timeout=1.0)

    def __enter__(self) -> "LogServer":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class LogClient:
    """A task's connection to the driver's ``LogServer``.

    A server that cannot be reached or a send that fails does not fail the
    task: the lines are then only kept in the task's own tail (and said so
    once on the task's stderr, i.e. in the executor log).
    """

    def __init__(self, address: Tuple[str, int], secret: bytes, connect_timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
        self._socket: Optional[socket.socket] = None
        try:
            sock = socket.create_connection(address, timeout=connect_timeout)
            try:
                nonce = sock.makefile("rb").readline(_NONCE_LINE_BYTES).strip()
                sock.sendall(_answer(secret, nonce) + b"\n")
                sock.settimeout(SEND_TIMEOUT_S)
            except OSError:
                sock.close()
                raise
            self._socket = sock
        except OSError as error:
            self._give_up(f"cannot reach the driver's log server at {address[0]}:{address[1]}: {error}")

    def _give_up(self, reason: str) -> None:
        print(f"sparktf.run: child output is not streamed to the driver: {reason}", file=sys.stderr, flush=True)
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def send(self, line: str) -> None:
        """Send one line (without newline)."""
        self._send_frame(_LINE, line)

    def report_failure(self, message: str) -> bool:
        """Send a failed child's message and wait (bounded) until the server holds it; False if it could not."""
        if not self._send_frame(_FAILURE, message):
            return False
        try:
            if self._socket.recv(1) == _ACK:
                return True
            reason = "the server did not acknowledge the failure"
        except OSError as error:
            reason = f"no acknowledgement of the failure: {error}"
        self._give_up(reason)
        return False

    def _send_frame(self, kind: bytes, text: str) -> bool:
        if self._socket is None:
            return False
        payload = text.encode("utf-8", "replace")[:MAX_FRAME_BYTES]
        try:
            self._socket.sendall(_HEADER.pack(kind, len(payload)) + payload)
            return True
        except OSError as error:
            self._give_up(f"sending failed: {error}")
            return False

    def close(self) -> None:
        """Close the connection; the server sees the end of the stream."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None
