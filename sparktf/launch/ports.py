"""Reserving a TCP port for a task's TensorFlow server without a race.

The usual way (bind port 0, read the port, close, hand the number to the
server) leaves a window in which another process can take the port. Here the
task keeps a socket bound to the port, on the wildcard address, with
``SO_REUSEADDR`` and **not listening**, for the child's whole life:

- the kernel never hands the port out to another ``bind(port 0)`` or to an
  outgoing connection, and a plain ``bind`` to it fails with
  ``EADDRINUSE``;
- TensorFlow's gRPC server sets ``SO_REUSEADDR`` itself, and Linux lets a
  ``SO_REUSEADDR`` socket bind a port whose other sockets are all
  ``SO_REUSEADDR`` and not listening, so the child's server takes the port
  while the task still holds it.

So there is no moment at which the port is free, and no retry is needed.
"""

from __future__ import annotations

import socket

__all__ = ["PortReservation"]


class PortReservation:
    """A TCP port held for a server that another process will start.

    Use it as a context manager; the port stays reserved until ``close``.

    Parameters
    ----------
    bind_address : str
        Address to bind; the default, the IPv4 wildcard, matches what a
        TensorFlow server binds and blocks the port on every interface.
    """

    def __init__(self, bind_address: str = "0.0.0.0") -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._socket.bind((bind_address, 0))
        except OSError:
            self._socket.close()
            raise
        self.port: int = self._socket.getsockname()[1]

    def close(self) -> None:
        """Release the port."""
        self._socket.close()

    def __enter__(self) -> "PortReservation":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
