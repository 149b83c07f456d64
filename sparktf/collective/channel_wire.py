"""The messages of the job channel: a JSON header, then the raw bytes of any arrays it announces.

A message is a 4-byte length, a UTF-8 JSON object of at most
``MAX_HEADER_BYTES``, and, when the header has ``"arrays": [[dtype, shape],
...]``, the bytes of each array in order. The receiver allocates every array
from the header and reads the socket straight into it (one copy, no
intermediate buffer), so a model's state of hundreds of MB streams through in
socket-sized chunks. Nothing read is ever unpickled, and only plain numeric
and boolean dtypes are accepted.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any, Callable, Dict, List, Sequence, Tuple, Union

import numpy as np

from sparktf.collective.transport import recv_exact

__all__ = ["MAX_HEADER_BYTES", "send_message", "recv_message", "ChannelClosed"]

MAX_HEADER_BYTES = 64 << 10
_LENGTH = struct.Struct("!I")
_CHUNK_BYTES = 8 << 20
_ARRAY_KINDS = frozenset("biufc")


class ChannelClosed(ConnectionError):
    """The other end closed the connection before a whole message arrived."""


def send_message(sock: socket.socket, header: Dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> None:
    """Send ``header`` (JSON-able) and the bytes of ``arrays``, which it then announces."""
    arrays = [np.ascontiguousarray(a).reshape(np.shape(a)) for a in arrays]  # 0-d arrays stay 0-d
    if arrays:
        header = dict(header, arrays=[[a.dtype.str, list(a.shape)] for a in arrays])
    body = json.dumps(header).encode()
    if len(body) > MAX_HEADER_BYTES:
        raise ValueError(f"a channel header of {len(body)} bytes is over the limit of {MAX_HEADER_BYTES}")
    sock.sendall(_LENGTH.pack(len(body)) + body)
    for array in arrays:
        view = memoryview(array.reshape(-1).view(np.uint8))
        for start in range(0, view.nbytes, _CHUNK_BYTES):
            sock.sendall(view[start : start + _CHUNK_BYTES])


def recv_message(sock: socket.socket, max_array_bytes: Union[None, int, Callable[[Dict[str, Any]], int]] = None
                 ) -> Tuple[Dict[str, Any], List[np.ndarray]]:
    """Receive one message: its header (without ``"arrays"``) and its arrays.

    ``max_array_bytes`` bounds the arrays' bytes: a number, or a function of the header (e.g. of its operation).

    Raises
    ------
    ChannelClosed
        The peer closed the connection first.
    ValueError
        The header is malformed, too big, or announces arrays of a dtype
        other than numbers and booleans, or more than ``max_array_bytes``.
    """
    head = bytearray(_LENGTH.size)
    if not recv_exact(sock, memoryview(head)):
        raise ChannelClosed("the connection closed")
    (size,) = _LENGTH.unpack(head)
    if size > MAX_HEADER_BYTES:
        raise ValueError(f"a channel header of {size} bytes is over the limit of {MAX_HEADER_BYTES}")
    body = bytearray(size)
    if not recv_exact(sock, memoryview(body)):
        raise ChannelClosed("the connection closed")
    header = json.loads(body)
    if not isinstance(header, dict):
        raise ValueError("a channel header must be a JSON object")
    arrays = [_empty_array(entry) for entry in header.pop("arrays", [])]
    total = sum(a.nbytes for a in arrays)
    limit = max_array_bytes(header) if callable(max_array_bytes) else max_array_bytes
    if limit is not None and total > limit:
        raise ValueError(f"the message announces {total} bytes of arrays, over the limit of {limit}")
    for array in arrays:
        view = memoryview(array.reshape(-1).view(np.uint8))
        for start in range(0, view.nbytes, _CHUNK_BYTES):
            if not recv_exact(sock, view[start : start + _CHUNK_BYTES]):
                raise ChannelClosed("the connection closed in the middle of an array")
    return header, arrays


def _empty_array(entry: Any) -> np.ndarray:
    try:
        dtype_text, shape = entry
        dtype = np.dtype(str(dtype_text))
        shape = tuple(int(n) for n in shape)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"a malformed array entry {entry!r} in a channel header: {exc}") from None
    if dtype.kind not in _ARRAY_KINDS or dtype.hasobject or any(n < 0 for n in shape):
        raise ValueError(f"the channel carries numeric arrays only, not {dtype_text!r} of shape {shape}")
    return np.empty(shape, dtype)
