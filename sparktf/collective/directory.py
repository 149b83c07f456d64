"""The peer directory: a rendezvous on the driver that tells every rank where the others listen.

Before the ring can connect, every rank must learn every other rank's
``host:port``. ``BarrierTaskContext.allGather`` can do that, but Spark's JVM
side checks for the answer once a second, so each call costs about 1 s even
when all tasks are ready (measured here: 1.00-1.02 s per call). Training
pays that on every segment (a barrier job), and after the first segment
nothing hides it.

:class:`PeerDirectory` runs on the driver for one barrier job: it listens on
the driver's own address (``spark.driver.host``, which executors must reach
anyway), authenticates each connecting rank with the job's secret (the
ring's HMAC handshake, the directory taking the pseudo-rank ``world_size``),
reads the rank's address, and once every rank has registered sends each the
full list as JSON. Nothing is read from a connection before it has proved it
holds the secret, and nothing is ever unpickled. :func:`directory_peers` is
the task's side.

A rank that registers again (a relaunched task) replaces its earlier entry.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time

from sparktf.collective.auth import HandshakeError, client_handshake, server_handshake
from sparktf.collective.rendezvous import (
    HANDSHAKE_SECONDS,
    POLL_SECONDS,
    bind_listener,
    connect_before,
    format_peer,
    parse_peer,
)
from sparktf.collective.transport import recv_exact
from sparktf.errors import CollectiveError

__all__ = ["PeerDirectory", "directory_peers"]

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct("!I")
_MAX_PEER_BYTES = 1024


class PeerDirectory:
    """Collects the ring addresses of ``world_size`` ranks and sends each rank all of them.

    Parameters
    ----------
    world_size : int
        Number of ranks that register.
    secret : bytes
        The job secret the ranks authenticate with.
    host : str
        The address to listen on: the driver's own (``spark.driver.host``).

    Attributes
    ----------
    address : str
        ``"host:port"`` the ranks connect to (pass it to :func:`directory_peers`).

    Notes
    -----
    Serves on a thread of its own until :meth:`close` (or the end of a
    ``with`` block), which joins the thread and closes every socket.
    """

    def __init__(self, world_size: int, secret: bytes, host: str):
        self._world_size = world_size
        self._secret = secret
        self._listener = bind_listener(host)
        self.address = format_peer(self._listener)
        self._registered: dict[int, tuple[socket.socket, str]] = {}
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="sparktf-peer-directory", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving; ranks still waiting for the list see their connection close."""
        self._closing.set()
        self._thread.join()
        self._listener.close()
        for sock, _ in self._registered.values():
            sock.close()
        self._registered.clear()

    def __enter__(self) -> "PeerDirectory":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _serve(self) -> None:
        self._listener.settimeout(POLL_SECONDS)
        while not self._closing.is_set():
            try:
                sock, address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # the listener was closed under us
                return
            self._register(sock, address)
            if len(self._registered) == self._world_size:
                self._answer()

    def _register(self, sock: socket.socket, address) -> None:
        sock.settimeout(HANDSHAKE_SECONDS)
        try:
            rank = server_handshake(sock, self._secret, self._world_size, None, self._world_size)
            peer = _receive(sock, _MAX_PEER_BYTES).decode("utf-8")
            parse_peer(peer)
        except (HandshakeError, OSError, UnicodeDecodeError, ValueError) as exc:
            logger.warning("the peer directory dropped a connection from %s: %s", address, exc)
            sock.close()
            return
        previous = self._registered.pop(rank, None)
        if previous is not None:
            previous[0].close()
        self._registered[rank] = (sock, peer)

    def _answer(self) -> None:
        """Send every registered rank the list of all addresses, then start over."""
        peers = json.dumps([self._registered[rank][1] for rank in range(self._world_size)]).encode()
        for sock, _ in self._registered.values():
            try:
                _send(sock, peers)
            except OSError as exc:  # that rank is gone: it fails on its own, the others find out in the ring
                logger.warning("the peer directory could not answer a rank: %s", exc)
            sock.close()
        self._registered.clear()


def directory_peers(directory: str, rank: int, world_size: int, peer: str, secret: bytes,
                    connect_timeout: float, timeout: float) -> list[str]:
    """Register ``peer`` (this rank's ring address) with the directory and return every rank's, by rank.

    Parameters
    ----------
    directory : str
        The directory's ``"host:port"`` (:attr:`PeerDirectory.address`).
    rank, world_size : int
        This rank and the number of ranks.
    peer : str
        This rank's listening ``"host:port"``.
    secret : bytes
        The job secret.
    connect_timeout : float
        Seconds to keep trying to reach the directory.
    timeout : float
        Seconds to wait for the other ranks to register.

    Raises
    ------
    CollectiveError
        The directory could not be reached or did not authenticate, or the
        other ranks did not register within ``timeout``.
    """
    sock = _connect(directory, connect_timeout)
    try:
        sock.settimeout(HANDSHAKE_SECONDS)
        try:
            client_handshake(sock, secret, rank, world_size, world_size)
        except (HandshakeError, OSError) as exc:
            raise CollectiveError(
                f"rank {rank} could not authenticate with the peer directory at {directory}: {exc}") from None
        _send(sock, peer.encode("utf-8"))
        sock.settimeout(timeout)
        try:
            peers = json.loads(_receive(sock, (_MAX_PEER_BYTES + 8) * world_size + 16))
        except TimeoutError:
            raise CollectiveError(
                f"rank {rank}: not every one of the {world_size} ranks registered with the peer directory "
                f"within {timeout:g} s; check that every task started") from None
        except (OSError, ValueError) as exc:
            raise CollectiveError(f"rank {rank}: the peer directory at {directory} failed: {exc}") from None
    finally:
        sock.close()
    return [str(entry) for entry in peers]


def _connect(directory: str, connect_timeout: float) -> socket.socket:
    try:
        return connect_before(parse_peer(directory), time.monotonic() + connect_timeout)
    except OSError as exc:
        raise CollectiveError(
            f"could not reach sparktf's peer directory on the driver at {directory} ({exc}); "
            "executors must be able to open TCP connections to spark.driver.host, or set "
            "spark.sparktf.rendezvous=barrier to exchange addresses through Spark "
            "(about 1 s slower per training job)") from None


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def _receive(sock: socket.socket, limit: int) -> bytes:
    """One length-prefixed message of at most ``limit`` bytes (``OSError`` if the peer closes first)."""
    head = bytearray(_LENGTH.size)
    if not recv_exact(sock, memoryview(head)):
        raise ConnectionError("the connection closed")
    (size,) = _LENGTH.unpack(head)
    if size > limit:
        raise ValueError(f"a message of {size} bytes is over the limit of {limit}")
    body = bytearray(size)
    if not recv_exact(sock, memoryview(body)):
        raise ConnectionError("the connection closed")
    return bytes(body)
