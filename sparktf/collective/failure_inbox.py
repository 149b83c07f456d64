"""The failure inbox: where a session's plain Spark tasks send why they failed, before they fail.

A plain Spark job (a record count, a dataset's Blocks, a prediction) has no
job channel, and Spark hands the driver only the text of a failed task. A
task whose sparktf error knows what went wrong sends its
:class:`~sparktf.errors.FailureRecord` to the driver's :class:`FailureInbox`
under the keys of the actions that ran it (job tags starting with
:data:`KEY_PREFIX`), waits for the answer, and only then fails in Spark; the
driver takes the record of its action when the action fails.

Like the job channel, the inbox reads nothing from a connection before it
has proved it holds the session's secret (``AuthenticatedServer``).
"""

from __future__ import annotations

import logging
import re
import secrets
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from sparktf.collective.auth import HandshakeError, client_handshake
from sparktf.collective.channel_wire import ChannelClosed, recv_message, send_message
from sparktf.collective.rendezvous import HANDSHAKE_SECONDS, parse_peer
from sparktf.collective.server import AuthenticatedServer
from sparktf.errors import FailureRecord

__all__ = ["FailureInbox", "InboxAddress", "KEY_PREFIX", "new_key", "send_failure"]

logger = logging.getLogger(__name__)

#: How an action's key starts: ``KEY_PREFIX`` + 32 hex digits, carried as a Spark job tag.
KEY_PREFIX = "sparktf-failures-"
_KEY = re.compile(re.escape(KEY_PREFIX) + r"[0-9a-f]{32}")
MAX_KEYS_PER_REPORT = 16  # the actions one task runs under: nested scopes of one thread
MAX_KEPT_RECORDS = 1024  # records whose action has not taken them; the oldest are dropped beyond that


def new_key() -> str:
    """A fresh action key (a valid Spark job tag)."""
    return KEY_PREFIX + secrets.token_hex(16)


@dataclass(frozen=True)
class InboxAddress:
    """What a task needs to reach the inbox: its ``"host:port"`` and the session's secret."""

    address: str
    secret: bytes

    def __repr__(self) -> str:  # the secret stays out of logs and Spark's UI
        return f"InboxAddress({self.address!r})"


class FailureInbox(AuthenticatedServer):
    """The driver's inbox of the failure records a session's plain Spark tasks send.

    Parameters
    ----------
    host : str
        The address to listen on: the driver's own (``spark.driver.host``).
    """

    name = "sparktf-failure-inbox"

    def __init__(self, host: str):
        self._records: "OrderedDict[str, FailureRecord]" = OrderedDict()
        super().__init__(1, secrets.token_bytes(32), host)

    @property
    def for_tasks(self) -> InboxAddress:
        """The address and secret the tasks connect with."""
        return InboxAddress(self.address, self._secret)

    def take(self, key: str) -> Optional[FailureRecord]:
        """The first record a task sent under ``key``, handed over once (None if none came)."""
        with self._lock:
            return self._records.pop(key, None)

    def _closed(self) -> None:
        self._records.clear()

    def _serve(self, sock: socket.socket, rank: int, address: Any) -> None:
        try:
            header, _ = recv_message(sock, max_array_bytes=0)
            keys = header["keys"]
            if not isinstance(keys, list) or not 0 < len(keys) <= MAX_KEYS_PER_REPORT or not all(
                    isinstance(key, str) and _KEY.fullmatch(key) for key in keys):
                raise ValueError(f"keys {str(keys)[:200]!r} are not action keys")
            record = FailureRecord.from_wire(header["record"])
        except ChannelClosed:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if not self._closing.is_set():
                logger.warning("the failure inbox dropped a report from %s: %s", address, exc)
            return
        with self._lock:
            for key in keys:
                self._records.setdefault(key, record)  # the first failure of an action is its cause
            while len(self._records) > MAX_KEPT_RECORDS:
                self._records.popitem(last=False)
        send_message(sock, {"ok": True})


def send_failure(inbox: InboxAddress, keys: Sequence[str], record: FailureRecord,
                 timeout: float = HANDSHAKE_SECONDS) -> bool:
    """Send ``record`` under ``keys`` and wait for the inbox's answer, at most ``timeout`` seconds.

    Returns
    -------
    bool
        Whether the driver holds the record now (False: unreachable, refused or silent).
    """
    deadline = time.monotonic() + timeout
    try:  # one attempt: the inbox listens as long as its session lives, a refusal means it is gone
        sock = socket.create_connection(parse_peer(inbox.address), timeout=timeout)
    except OSError:
        return False
    try:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        client_handshake(sock, inbox.secret, 0, 1, 1)
        send_message(sock, {"keys": list(keys), "record": record.to_wire()})
        answer, _ = recv_message(sock, max_array_bytes=0)
        return answer.get("ok") is True
    except (HandshakeError, OSError, ValueError):
        return False
    finally:
        sock.close()
