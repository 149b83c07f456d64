"""Mutual HMAC challenge-response that opens every ring connection.

Both ends prove they know the per-job secret without sending it.  The
connecting side (the *client*, rank ``c``) and the accepting side (the
*server*, rank ``s``) each contribute a random nonce; each side's MAC covers
both nonces, the world size, both ranks and its role (``client`` or
``server``), so a MAC can be neither replayed on another connection nor
reflected back at its sender.

Wire format (all integers big-endian)::

    client -> server  b"STFC" | world_size:u32 | client_rank:u32 | nonce_c[32]
    server -> client  b"STFS" | server_rank:u32 | nonce_s[32] | mac_server[32]
    client -> server  mac_client[32]
    server -> client  b"OK"

The server proves itself first; it closes the connection without reading
anything further when the client's rank or MAC is wrong.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct

from sparktf.errors import CollectiveError

__all__ = ["HandshakeError", "MIN_SECRET_BYTES", "check_secret", "client_handshake", "server_handshake"]

MIN_SECRET_BYTES = 16
_NONCE_BYTES = 32
_MAC_BYTES = hashlib.sha256().digest_size
_LABEL = b"sparktf-collective-v1"
_CLIENT_HELLO = struct.Struct("!4sII")  # magic, world_size, client_rank
_SERVER_HELLO = struct.Struct("!4sI")  # magic, server_rank
_ACCEPTED = b"OK"


class HandshakeError(CollectiveError):
    """The other end of a connection did not prove it belongs to this job."""


def check_secret(secret: bytes) -> bytes:
    """Return ``secret`` if it is usable as a job secret, else raise ``TypeError`` / ``ValueError``."""
    if not isinstance(secret, (bytes, bytearray)):
        raise TypeError("the collective secret must be bytes (e.g. secrets.token_bytes(32)), "
                        f"got {type(secret).__name__}")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the collective secret must have at least {MIN_SECRET_BYTES} bytes, got {len(secret)}")
    return bytes(secret)


def _mac(secret: bytes, role: bytes, world_size: int, client_rank: int, server_rank: int,
         nonce_c: bytes, nonce_s: bytes) -> bytes:
    ranks = struct.pack("!III", world_size, client_rank, server_rank)
    return hmac.new(secret, b"|".join([_LABEL, role, ranks, nonce_c, nonce_s]), hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise HandshakeError("the connection closed during the handshake")
        data += chunk
    return bytes(data)


def client_handshake(sock: socket.socket, secret: bytes, rank: int, server_rank: int, world_size: int) -> None:
    """Authenticate a freshly connected socket from ``rank`` to ``server_rank``.

    Raises
    ------
    HandshakeError
        The server did not prove it knows the secret, is not ``server_rank``,
        or refused this client.
    """
    nonce_c = secrets.token_bytes(_NONCE_BYTES)
    sock.sendall(_CLIENT_HELLO.pack(b"STFC", world_size, rank) + nonce_c)
    reply = _recv_exact(sock, _SERVER_HELLO.size + _NONCE_BYTES + _MAC_BYTES)
    magic, claimed = _SERVER_HELLO.unpack_from(reply)
    nonce_s = reply[_SERVER_HELLO.size:_SERVER_HELLO.size + _NONCE_BYTES]
    mac_server = reply[_SERVER_HELLO.size + _NONCE_BYTES:]
    if magic != b"STFS" or claimed != server_rank:
        raise HandshakeError(
            f"the listener is not rank {server_rank} of this job (it answered as {magic!r} rank {claimed})")
    expected = _mac(secret, b"server", world_size, rank, server_rank, nonce_c, nonce_s)
    if not hmac.compare_digest(mac_server, expected):
        raise HandshakeError(f"the listener for rank {server_rank} did not prove it knows the job secret")
    sock.sendall(_mac(secret, b"client", world_size, rank, server_rank, nonce_c, nonce_s))
    if _recv_exact(sock, len(_ACCEPTED)) != _ACCEPTED:
        raise HandshakeError(f"rank {server_rank} did not accept the connection")


def server_handshake(sock: socket.socket, secret: bytes, rank: int, client_rank: int | None,
                     world_size: int) -> int:
    """Authenticate an accepted socket that must come from ``client_rank``.

    ``client_rank=None`` accepts any rank in ``[0, world_size)`` (the peer
    directory, which does not know who connects).

    Returns
    -------
    int
        The client's rank.

    Raises
    ------
    HandshakeError
        The client spoke another protocol, claimed another rank or world
        size, or did not prove it knows the secret.
    """
    hello = _recv_exact(sock, _CLIENT_HELLO.size + _NONCE_BYTES)
    magic, claimed_world, claimed_rank = _CLIENT_HELLO.unpack_from(hello)
    if magic != b"STFC":
        raise HandshakeError(f"the client does not speak the sparktf collective protocol (magic {magic!r})")
    expected_rank = claimed_rank in range(world_size) if client_rank is None else claimed_rank == client_rank
    if claimed_world != world_size or not expected_rank:
        wanted = "a rank" if client_rank is None else f"rank {client_rank}"
        raise HandshakeError(
            f"the client claims rank {claimed_rank} of {claimed_world}, expected {wanted} of {world_size}")
    nonce_c = hello[_CLIENT_HELLO.size:]
    nonce_s = secrets.token_bytes(_NONCE_BYTES)
    sock.sendall(_SERVER_HELLO.pack(b"STFS", rank) + nonce_s
                 + _mac(secret, b"server", world_size, claimed_rank, rank, nonce_c, nonce_s))
    mac_client = _recv_exact(sock, _MAC_BYTES)
    expected = _mac(secret, b"client", world_size, claimed_rank, rank, nonce_c, nonce_s)
    if not hmac.compare_digest(mac_client, expected):
        raise HandshakeError(f"the client claiming rank {claimed_rank} did not prove it knows the job secret")
    sock.sendall(_ACCEPTED)
    return claimed_rank
