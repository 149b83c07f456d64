"""``AuthenticatedServer``: the driver's listener that tasks prove the job's secret to before anything is read.

The job channel (one barrier job's ranks) and the failure inbox (a session's
plain Spark tasks) are both one: every connection is handled on a thread of
its own, so a silent or slow client costs the others nothing; it must
authenticate (the ring's HMAC handshake, the server taking the pseudo-rank
``world_size``) within ``HANDSHAKE_SECONDS``; at most ``MAX_AUTHENTICATING``
connections may be authenticating at once (more are closed at once); a
rejected connection is logged once with its address. What an authenticated
connection may ask is the subclass's :meth:`AuthenticatedServer._serve`.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any, List

from sparktf.collective.auth import HandshakeError, server_handshake
from sparktf.collective.rendezvous import HANDSHAKE_SECONDS, MAX_AUTHENTICATING, AcceptLoop, bind_listener, format_peer

__all__ = ["AuthenticatedServer", "shut"]

logger = logging.getLogger(__name__)


class AuthenticatedServer:
    """A listener on ``host`` whose clients (ranks ``0 .. world_size - 1``) authenticate with ``secret``.

    A subclass sets its own attributes, then calls ``super().__init__``,
    which starts accepting.

    Attributes
    ----------
    address : str
        ``"host:port"`` the clients connect to.
    """

    #: What the server is, in its log lines and thread names.
    name = "sparktf-server"

    def __init__(self, world_size: int, secret: bytes, host: str):
        self._world_size = world_size
        self._secret = secret
        self._listener = bind_listener(host)
        self.address = format_peer(self._listener)
        self._lock = threading.Lock()
        self._connections: set = set()
        self._authenticating = threading.BoundedSemaphore(MAX_AUTHENTICATING)
        self._closing = threading.Event()
        self._threads: List[threading.Thread] = []
        self._accepting = AcceptLoop(self._listener, self._accepted, self.name).start()

    def close(self) -> None:
        """Stop serving and shut every connection (the clients see it is over); once."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._accepting.stop()
        self._listener.close()
        with self._lock:
            connections = list(self._connections)
            self._closed()
        for sock in connections:
            shut(sock)
        for thread in self._threads:
            thread.join(timeout=HANDSHAKE_SECONDS)

    def __enter__(self) -> "AuthenticatedServer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ for subclasses

    def _serve(self, sock: socket.socket, rank: int, address: Any) -> None:
        """Answer the authenticated connection of ``rank`` until it ends."""
        raise NotImplementedError

    def _closed(self) -> None:
        """Drop what the server holds; called once, under its lock, as it closes."""

    def _ended(self, sock: socket.socket) -> None:
        """Forget ``sock``, whose connection ended; called under the server's lock."""

    # ------------------------------------------------------------------ serving

    def _accepted(self, sock: socket.socket, address: Any) -> None:
        """Start the connection's thread (or refuse it when too many are authenticating)."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small messages, answered at once
        if not self._authenticating.acquire(blocking=False):
            logger.warning("the %s refused a connection from %s: %d others are still authenticating",
                           self.name, address, MAX_AUTHENTICATING)
            sock.close()
            return
        with self._lock:
            self._connections.add(sock)
        thread = threading.Thread(target=self._handle, args=(sock, address), daemon=True,
                                  name=f"{self.name}-connection")
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _handle(self, sock: socket.socket, address: Any) -> None:
        try:
            rank = self._authenticate(sock, address)
            if rank is not None:
                self._serve(sock, rank, address)
        finally:
            with self._lock:
                self._connections.discard(sock)
                self._ended(sock)
            sock.close()

    def _authenticate(self, sock: socket.socket, address: Any) -> int | None:
        try:
            sock.settimeout(HANDSHAKE_SECONDS)
            return server_handshake(sock, self._secret, self._world_size, None, self._world_size)
        except (HandshakeError, OSError) as exc:
            if not self._closing.is_set():
                logger.warning("the %s dropped a connection from %s: %s", self.name, address, exc)
            return None
        finally:
            self._authenticating.release()


def shut(sock: socket.socket) -> None:
    """Shut ``sock`` down both ways, which wakes a thread blocked reading it."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
