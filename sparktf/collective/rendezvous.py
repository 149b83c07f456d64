"""Building the ring: listen on the executor's own address, connect to the right, accept from the left.

Each rank accepts exactly one authenticated connection (from its left
neighbour) on its listening socket and opens one (to its right neighbour).
Accepting runs on a short-lived thread, joined before ``connect_ring``
returns, so that every rank can wait for its right neighbour's handshake
while answering its left neighbour's.  A connection that fails the handshake
is logged and dropped; the listener keeps accepting until the real left
neighbour authenticates or the deadline passes.
"""

from __future__ import annotations

import json
import logging
import selectors
import socket
import threading
import time
from typing import Any, Callable

from sparktf.collective.auth import HandshakeError, client_handshake, server_handshake
from sparktf.collective.transport import configure_socket
from sparktf.errors import CollectiveError

__all__ = [
    "HANDSHAKE_SECONDS",
    "AcceptLoop",
    "barrier_task_peers",
    "bind_listener",
    "checked_claim",
    "connect_before",
    "connect_ring",
    "format_peer",
    "parse_peer",
]

logger = logging.getLogger(__name__)

HANDSHAKE_SECONDS = 10.0  # the most one accepted connection may take to authenticate
MAX_AUTHENTICATING = 16  # connections a listener lets authenticate at once
_RETRY_SECONDS = 0.05


def bind_listener(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """Return a TCP socket listening on ``host:port``.

    Parameters
    ----------
    host : str
        The address to listen on: the executor's own address, never a wildcard.
    port : int
        The port; 0 lets the kernel choose a free one.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.bind((host, port))
        listener.listen(16)
    except OSError:
        listener.close()
        raise
    return listener


def format_peer(listener: socket.socket) -> str:
    """The ``"host:port"`` (``"[v6host]:port"`` for IPv6) other ranks use to reach ``listener``."""
    host, port = listener.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_peer(peer: str) -> tuple[str, int]:
    """Split ``"host:port"`` or ``"[v6host]:port"`` into ``(host, port)``."""
    host, _, port = peer.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a peer address must look like 'host:port', got {peer!r}")
    return host.strip("[]"), int(port)


def barrier_task_peers(ctx, listener: socket.socket, claim: int | None = None) -> tuple[list[str], list[int | None]]:
    """Publish this task's listening address and ``claim`` through Spark; return every task's, by partition id."""
    published = [json.loads(message) for message in ctx.allGather(json.dumps({"peer": format_peer(listener),
                                                                               "claim": claim}))]
    return ([message["peer"] for message in published],
            [checked_claim(message.get("claim"), len(published)) for message in published])


def checked_claim(claim: Any, world_size: int) -> int | None:
    """``claim`` (what a rank publishes with its address: None or an index below ``world_size``), checked.

    Raises
    ------
    ValueError
        Anything else.
    """
    if claim is None or (type(claim) is int and 0 <= claim < world_size):
        return claim
    raise ValueError(f"a rank's claim must be None or an integer in [0, {world_size}), got {claim!r:.40}")


def connect_ring(rank: int, peers: list[str], listener: socket.socket, secret: bytes,
                 timeout: float) -> tuple[socket.socket, socket.socket]:
    """Return authenticated ``(left, right)`` sockets of ``rank`` in the ring of ``peers``.

    Raises
    ------
    CollectiveError
        A neighbour did not connect or authenticate within ``timeout`` seconds.
    """
    world_size = len(peers)
    deadline = time.monotonic() + timeout
    acceptor = _LeftAcceptor(rank, world_size, listener, secret, deadline)
    acceptor.start()
    try:
        right = _connect_right(rank, peers, secret, deadline, timeout)
    except BaseException:
        acceptor.cancel()
        raise
    left = acceptor.result()
    if left is None:
        right.close()
        raise CollectiveError(
            f"rank {(rank - 1) % world_size} did not connect to rank {rank} within {timeout:g} s; "
            "check that every rank started and that its task did not fail")
    configure_socket(left, timeout)
    configure_socket(right, timeout)
    return left, right


def connect_before(address: tuple[str, int], deadline: float) -> socket.socket:
    """Connect to ``address``, retrying refused and timed-out attempts until ``deadline`` (``time.monotonic()``).

    Each attempt may take the whole remaining time (a listener may first be
    busy dropping intruders).

    Raises
    ------
    TimeoutError
        No attempt succeeded before ``deadline``.
    OSError
        Any other connection failure, at once.
    """
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"could not connect to {address[0]}:{address[1]} in time")
        try:
            return socket.create_connection(address, timeout=remaining)
        except (ConnectionRefusedError, TimeoutError):
            time.sleep(_RETRY_SECONDS)


def _connect_right(rank: int, peers: list[str], secret: bytes, deadline: float, timeout: float) -> socket.socket:
    right_rank = (rank + 1) % len(peers)
    try:
        sock = connect_before(parse_peer(peers[right_rank]), deadline)
    except TimeoutError:
        raise CollectiveError(
            f"rank {rank} could not reach rank {right_rank} at {peers[right_rank]} within {timeout:g} s; "
            "check that it started and that the address is reachable") from None
    try:
        client_handshake(sock, secret, rank, right_rank, len(peers))
    except (HandshakeError, OSError) as exc:
        sock.close()
        raise CollectiveError(
            f"rank {rank} could not authenticate with rank {right_rank} at {peers[right_rank]}: {exc}; "
            "every rank must use the same job secret and peer list") from None
    return sock


class _LeftAcceptor:
    """Accepts connections until the left neighbour authenticates, on a thread of its own.

    Each accepted connection authenticates on a thread of its own, with its
    own handshake deadline, so a silent or bad local client costs the real
    neighbour nothing; at most ``MAX_AUTHENTICATING`` may be authenticating
    at once (more are closed at once).
    """

    def __init__(self, rank: int, world_size: int, listener: socket.socket, secret: bytes, deadline: float):
        self._rank = rank
        self._left_rank = (rank - 1) % world_size
        self._world_size = world_size
        self._listener = listener
        self._secret = secret
        self._deadline = deadline
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_AUTHENTICATING)
        self._left: socket.socket | None = None
        self._loop = AcceptLoop(listener, self._accepted, f"sparktf-collective-accept-rank{rank}", deadline)

    def start(self) -> None:
        self._loop.start()

    def cancel(self) -> None:
        self._loop.stop()
        with self._lock:
            left, self._left = self._left, None
        if left is not None:
            left.close()

    def result(self) -> socket.socket | None:
        self._loop.join()  # returns when the left neighbour authenticated (woken at once) or at the deadline
        self._loop.stop()
        with self._lock:
            return self._left

    def _accepted(self, sock: socket.socket, address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            logger.warning("rank %d refused a connection from %s: %d others are still authenticating",
                           self._rank, address, MAX_AUTHENTICATING)
            sock.close()
            return
        threading.Thread(target=self._authenticate, args=(sock, address, self._deadline - time.monotonic()),
                         daemon=True, name=f"sparktf-collective-handshake-rank{self._rank}").start()

    def _authenticate(self, sock: socket.socket, address, remaining: float) -> None:
        try:
            sock.settimeout(min(remaining, HANDSHAKE_SECONDS))
            server_handshake(sock, self._secret, self._rank, self._left_rank, self._world_size)
        except (HandshakeError, OSError) as exc:
            logger.warning("rank %d dropped a connection from %s that claimed to be rank %d: %s",
                           self._rank, address, self._left_rank, exc)
            sock.close()
            return
        finally:
            self._slots.release()
        with self._lock:
            if self._left is None and not self._loop.woken:
                self._left = sock
                self._loop.wake()  # stop accepting: the left neighbour is here
                return
        sock.close()


class AcceptLoop:
    """A thread handing every connection to ``listener`` to ``accepted(sock, address)`` until woken.

    :meth:`wake` (from any thread, any number of times) ends it at once; it
    also ends at ``deadline`` (``time.monotonic()``), if given. The listener
    is put in non-blocking mode; accepted sockets are blocking. A connection
    that fails while it is being accepted is dropped, not the loop.
    """

    def __init__(self, listener: socket.socket, accepted: Callable[[socket.socket, Any], None], name: str,
                 deadline: float | None = None):
        self._listener = listener
        self._accepted = accepted
        self._deadline = deadline
        self._wake, self._waker = socket.socketpair()
        self._lock = threading.Lock()
        self.woken = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "AcceptLoop":
        """Start accepting; returns ``self``."""
        self._thread.start()
        return self

    def wake(self) -> None:
        """Make the loop return (it stops accepting); nothing once it is stopped."""
        with self._lock:
            if not self._closed and not self.woken:
                self.woken = True
                self._waker.send(b"x")

    def join(self) -> None:
        """Wait for the loop to return: woken, or at its deadline."""
        self._thread.join()

    def stop(self) -> None:
        """Wake the loop, wait for it and release its socket pair (once)."""
        self.wake()
        self._thread.join()
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.close()
        self._waker.close()

    def _run(self) -> None:
        self._listener.setblocking(False)
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake, selectors.EVENT_READ)
            while True:
                timeout = None if self._deadline is None else self._deadline - time.monotonic()
                if timeout is not None and timeout <= 0:
                    return
                ready = selector.select(timeout)
                if any(key.fileobj is self._wake for key, _ in ready):
                    return
                if ready:
                    self._accept_one()

    def _accept_one(self) -> None:
        try:
            sock, address = self._listener.accept()
        except (BlockingIOError, InterruptedError):  # the client went away between select and accept
            return
        try:
            sock.setblocking(True)
            self._accepted(sock, address)
        except OSError as error:  # e.g. reset before its options were set: that one connection is lost
            logger.warning("dropped a connection from %s as it was accepted: %s", address, error)
            sock.close()
