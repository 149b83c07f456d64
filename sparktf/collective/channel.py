"""The job channel: the driver's authenticated server for one barrier job.

Every rank of a training segment talks to the driver through it:

* **peer directory** (``register``): each rank sends its ring address; once
  all ``world_size`` ranks have registered, each gets the full list (a rank
  that registers again, e.g. a relaunched task, replaces its entry);
* **model state** (``get_state`` / ``put_state``): the start weights and
  optimizer variables stream to the workers, and rank 0's final state streams
  back, as raw arrays (:mod:`sparktf.collective.channel_wire`), never through
  the JVM. A rank may ask for some arrays' rows only (its rows of a sharded
  table and its optimizer state) and then sends back those rows of its final
  state; an evaluation task asks for a sharded table's rows by id, a batch's
  at a time (``get_rows``), and never holds the whole table;
* **orders** (``next_order``): a resident job's ranks report the pass they
  finished and wait for the next one (:meth:`JobChannel.give_orders`);
* **reports** (``report``): each rank's heartbeat with its phase and
  iteration, which the driver's watchdog reads, and rank 0's values (loss,
  metrics) of every iteration since its previous report, which the channel
  keeps until the driver takes them (live per-iteration callbacks).

It is an :class:`~sparktf.collective.server.AuthenticatedServer`: nothing is
read from a connection before it has proved it holds the job's secret, each
connection has a thread of its own, and :meth:`JobChannel.close` shuts every
connection, which tells the workers the job is over.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from sparktf.collective.channel_wire import ChannelClosed, recv_message, send_message
from sparktf.collective.rendezvous import checked_claim, parse_peer
from sparktf.collective.server import AuthenticatedServer, shut
from sparktf.errors import FailureRecord

__all__ = ["JobChannel", "MAX_WINDOW_BYTES", "RankReport"]

logger = logging.getLogger(__name__)


_MAX_PEER_CHARS = 1024
_MAX_PHASE_NAME_CHARS = 64  # "data_cache", "warm_up", "compute", ...: a name, not a message
_MAX_BATCH_NAMES = 256  # the values of one iteration: the loss and the metrics
_MAX_NAME_CHARS = 256
_MAX_BATCHES_PER_REPORT = 4096  # a heartbeat sends far fewer (channel_client.MAX_REPORTED_BATCHES)
MAX_KEPT_BATCHES = 8192  # per rank, until the driver takes them; older ones are dropped beyond that
MAX_KEPT_WINDOWS = 64  # step windows per rank, until the driver takes them
MAX_ROW_REQUEST_BYTES = 16 << 20  # the ids of one ``get_rows`` request (2M int64 ids)
#: The most bytes of one step window (as JSON): the channel keeps it as it came, the training side reads it.
MAX_WINDOW_BYTES = 4096
MAX_ORDER_REPORT_BYTES = 64 << 20  # a resident rank's report of a pass: metric totals, per-iteration values

#: A resident job's orders: ``(rank, header, arrays) -> answer`` (see :meth:`JobChannel.give_orders`).
Orders = Callable[[int, Dict[str, Any], List[np.ndarray]], Dict[str, Any]]
#: One iteration's values: ``(iteration, (loss, metric, ...))``.
BatchValues = Tuple[int, Tuple[float, ...]]


@dataclass(frozen=True)
class RankReport:
    """The last report of one rank.

    Attributes
    ----------
    phase : str
        What the rank is doing (``"data_cache"``, ``"warm_up"``, a step's ``"data"``, ``"compute"``,
        ``"exchange"``, ...).
    iteration : int
        Its absolute iteration counter.
    changed_at : float
        ``time.monotonic()`` when ``(phase, iteration)`` last changed.
    loss : float, optional
        The training loss of ``iteration`` (the same on every rank).
    batch_names : tuple of str
        The names of the values in ``batches`` (``"loss"``, then the metrics).
    batches : tuple
        ``(iteration, values)`` of consecutive iterations in order, handed
        over once (see :meth:`JobChannel.reports`); empty otherwise.
    failure : FailureRecord, optional
        Why the rank failed, when it knew (sent in its last report).
    stack : tuple of str
        The innermost frames of its task thread (outermost first), sent while
        it stays in one phase and iteration (see ``channel_client.STACK_AFTER_SECONDS``).
    windows : tuple of dict
        Its step timings since the last hand-over, in order (handed over like ``batches``): opaque here, each a
        JSON object of at most :data:`MAX_WINDOW_BYTES` that the training side wrote and reads
        (``training.worker.step_clock.StepWindow``).
    """

    phase: str
    iteration: int
    changed_at: float
    loss: Optional[float] = None
    batch_names: Tuple[str, ...] = ()
    batches: Tuple[BatchValues, ...] = ()
    failure: Optional[FailureRecord] = None
    stack: Tuple[str, ...] = ()
    windows: Tuple[Dict[str, Any], ...] = ()


class JobChannel(AuthenticatedServer):
    """The driver's server for the ranks of one barrier job.

    Parameters
    ----------
    world_size : int
        Number of ranks.
    secret : bytes
        The job secret the ranks authenticate with.
    host : str
        The address to listen on: the driver's own (``spark.driver.host``).

    Attributes
    ----------
    address : str
        ``"host:port"`` the ranks connect to.
    """

    name = "sparktf-job-channel"

    def __init__(self, world_size: int, secret: bytes, host: str):
        self._registered: Dict[int, Tuple[socket.socket, str, Optional[int]]] = {}  # rank -> (sock, peer, claim)
        self._state: Optional[Tuple[Dict[str, Any], List[np.ndarray]]] = None
        self._state_bytes = 0
        self._uploaded: Dict[int, Tuple[Dict[str, Any], List[np.ndarray]]] = {}  # by rank
        self._rows_served: Dict[int, int] = {}  # rank -> bytes of the rows it asked for
        self._reports: Dict[int, RankReport] = {}
        self._batches: Dict[int, Deque[BatchValues]] = {}
        self._batch_names: Dict[int, Tuple[str, ...]] = {}
        self._windows: Dict[int, Deque[Dict[str, Any]]] = {}
        self._orders: Optional[Orders] = None
        super().__init__(world_size, secret, host)

    # ------------------------------------------------------------------ driver API

    def serve_state(self, meta: Dict[str, Any], arrays: Sequence[np.ndarray]) -> None:
        """Make ``(meta, arrays)`` what ``get_state`` answers (the arrays are sent as they are)."""
        with self._lock:
            self._state = (dict(meta), list(arrays))
            self._state_bytes = sum(np.asarray(a).nbytes for a in arrays)

    def give_orders(self, orders: "Orders") -> None:
        """Answer the ranks' ``next_order`` requests with ``orders(rank, header, arrays)`` (a resident job's passes).

        ``orders`` runs on the rank's connection thread and may wait, a bounded
        time, for the next order; the header and arrays carry what the rank
        reports of the order it finished.
        """
        with self._lock:
            self._orders = orders

    def take_uploaded(self) -> Dict[int, Tuple[Dict[str, Any], List[np.ndarray]]]:
        """The uploaded states by rank (rank 0's whole, the others' rows), handed over once."""
        with self._lock:
            uploaded, self._uploaded = self._uploaded, {}
            return uploaded

    def reports(self, take_batches: bool = False) -> Dict[int, RankReport]:
        """The last report of every rank that reported, by rank.

        With ``take_batches``, each report also carries the per-iteration
        values and the step windows the rank sent since the last such call
        (each handed over once; at most ``MAX_KEPT_BATCHES`` and
        ``MAX_KEPT_WINDOWS`` of the newest are kept between calls).
        """
        with self._lock:
            if not take_batches:
                return dict(self._reports)
            reports = {}
            for rank, report in self._reports.items():
                kept, windows = self._batches.pop(rank, ()), self._windows.pop(rank, ())
                if kept:
                    report = dataclasses.replace(report, batch_names=self._batch_names[rank], batches=tuple(kept))
                reports[rank] = dataclasses.replace(report, windows=tuple(windows)) if windows else report
            return reports

    # ------------------------------------------------------------------ serving

    def _closed(self) -> None:
        self._registered.clear()
        self._state = None
        self._uploaded = {}

    def _ended(self, sock: socket.socket) -> None:
        for registered_rank, (registered, _, _) in list(self._registered.items()):
            if registered is sock:
                del self._registered[registered_rank]

    def _serve(self, sock: socket.socket, rank: int, address: Any) -> None:
        sock.settimeout(None)  # authenticated: close() ends a blocked read
        while not self._closing.is_set():
            try:
                header, arrays = recv_message(sock, max_array_bytes=lambda header: self._upload_limit(rank, header))
                self._dispatch(sock, rank, header, arrays)
            except ChannelClosed:
                return
            except (OSError, ValueError, KeyError, TypeError) as exc:
                if not self._closing.is_set():
                    logger.warning("the job channel dropped rank %d at %s: %s", rank, address, exc)
                return

    def _upload_limit(self, rank: int, header: Dict[str, Any]) -> int:
        """The ids of a ``get_rows`` request are at most ``MAX_ROW_REQUEST_BYTES``; else rank 0 uploads at most a
        little more than the state it was served, another rank the rows it asked for (none when it asked for none)."""
        if header.get("op") == "get_rows":
            return MAX_ROW_REQUEST_BYTES
        if header.get("op") == "next_order":
            return MAX_ORDER_REPORT_BYTES
        with self._lock:
            return 2 * self._state_bytes + (64 << 20) if rank == 0 else 2 * self._rows_served.get(rank, 0)

    def _dispatch(self, sock: socket.socket, rank: int, header: Dict[str, Any], arrays: List[np.ndarray]) -> None:
        op = header.get("op")
        if op == "report":
            loss = header.get("loss")
            failure = header.get("failure")
            self._record_report(rank, str(header["phase"])[:_MAX_PHASE_NAME_CHARS], int(header["iteration"]),
                                None if loss is None else float(loss),
                                None if failure is None else FailureRecord.from_wire(failure),
                                tuple(str(line) for line in header.get("stack") or ()))
            if header.get("batches") is not None:
                self._record_batches(rank, *_batches(header["batches"]))
            if header.get("steps") is not None:
                window = _opaque_window(header["steps"])
                with self._lock:
                    self._windows.setdefault(rank, deque(maxlen=MAX_KEPT_WINDOWS)).append(window)
            if failure is not None:  # the task waits for this before it fails in Spark
                send_message(sock, {"ok": True})
        elif op == "register":
            self._register(sock, rank, str(header["peer"]), checked_claim(header.get("claim"), self._world_size))
        elif op in ("get_state", "get_rows"):
            with self._lock:
                state = self._state
            if state is None:
                send_message(sock, {"error": "the driver has no state for this job"})
            elif op == "get_state":
                cut, rows_bytes = _rows_of(state[1], header.get("rows") or ())
                with self._lock:
                    self._rows_served[rank] = rows_bytes
                send_message(sock, state[0], cut)
            else:  # rows of one served array by id: a sharded table's rows a task's batch looks up
                send_message(sock, {}, [_rows_by_id(state[1], int(header["index"]), arrays)])
        elif op == "next_order":
            with self._lock:
                orders = self._orders
            answer = {"error": "this job takes no orders"} if orders is None else orders(rank, header, arrays)
            send_message(sock, answer)
        elif op == "put_state":
            with self._lock:
                self._uploaded[rank] = (header.get("meta", {}), arrays)
            send_message(sock, {"ok": True})
        else:
            raise ValueError(f"unknown operation {op!r}")

    def _record_report(self, rank: int, phase: str, iteration: int, loss: Optional[float],
                       failure: Optional[FailureRecord], stack: Tuple[str, ...] = ()) -> None:
        with self._lock:
            last = self._reports.get(rank)
            if last is None or (last.phase, last.iteration) != (phase, iteration) or failure is not None:
                self._reports[rank] = RankReport(phase, iteration, time.monotonic(), loss,
                                                 failure=failure or (last.failure if last else None), stack=stack)
            elif stack:
                self._reports[rank] = dataclasses.replace(last, stack=stack)

    def _record_batches(self, rank: int, names: Tuple[str, ...], batches: List[BatchValues]) -> None:
        with self._lock:
            kept = self._batches.get(rank)
            if kept is None or self._batch_names.get(rank) != names:
                kept = self._batches[rank] = deque(maxlen=MAX_KEPT_BATCHES)
                self._batch_names[rank] = names
            kept.extend(batches)

    def _register(self, sock: socket.socket, rank: int, peer: str, claim: Optional[int]) -> None:
        if len(peer) > _MAX_PEER_CHARS:
            raise ValueError(f"a peer address of {len(peer)} characters")
        parse_peer(peer)
        with self._lock:
            previous = self._registered.pop(rank, None)
            if previous is not None and previous[0] is not sock:
                shut(previous[0])
            self._registered[rank] = (sock, peer, claim)
            if len(self._registered) < self._world_size:
                return
            registered, self._registered = self._registered, {}
        answer = {"peers": [registered[r][1] for r in range(self._world_size)],
                  "claims": [registered[r][2] for r in range(self._world_size)]}
        for waiting, _, _ in registered.values():
            try:
                send_message(waiting, answer)
            except OSError as exc:  # that rank is gone: it fails on its own, the others find out in the ring
                logger.warning("the job channel could not answer a rank: %s", exc)


def _rows_of(arrays: List[np.ndarray], rows: Sequence[Sequence[int]]) -> Tuple[List[np.ndarray], int]:
    """``arrays`` with those ``rows`` names (``[index, start, end]`` each) cut to those rows (views), and the cut
    arrays' bytes."""
    cut = list(arrays)
    rows_bytes = 0
    for index, start, end in rows:
        index, start, end = int(index), int(start), int(end)
        if not (0 <= index < len(cut) and np.ndim(cut[index]) and 0 <= start <= end <= len(cut[index])):
            raise ValueError(f"rows {start}:{end} of state array {index} do not exist")
        cut[index] = cut[index][start:end]
        rows_bytes += cut[index].nbytes
    return cut, rows_bytes


def _rows_by_id(arrays: List[np.ndarray], index: int, asked: List[np.ndarray]) -> np.ndarray:
    """The rows of served array ``index`` at the ids ``asked`` holds (one int64 array of them), in their order."""
    if not 0 <= index < len(arrays) or not np.ndim(arrays[index]):
        raise ValueError(f"state array {index} has no rows")
    if len(asked) != 1 or asked[0].dtype != np.int64 or asked[0].ndim != 1:
        raise ValueError("a row request holds one 1-D array of int64 ids")
    ids, table = asked[0], arrays[index]
    if ids.size and (ids.min() < 0 or ids.max() >= len(table)):
        raise ValueError(f"ids out of the {len(table)} rows of state array {index}")
    return np.take(table, ids, axis=0)


def _batches(message: Any) -> Tuple[Tuple[str, ...], List[BatchValues]]:
    """``(names, [(iteration, values), ...])`` of a report's ``batches``: consecutive iterations from ``first``.

    Raises
    ------
    ValueError, TypeError, KeyError
        The message is malformed or over the limits (the connection is dropped).
    """
    names = tuple(str(name)[:_MAX_NAME_CHARS] for name in message["names"])
    rows = message["values"]
    if not 0 < len(names) <= _MAX_BATCH_NAMES or len(rows) > _MAX_BATCHES_PER_REPORT:
        raise ValueError(f"a report of {len(rows)} iterations of {len(names)} values each")
    first = int(message["first"])
    batches = []
    for offset, row in enumerate(rows):
        if len(row) != len(names):
            raise ValueError(f"an iteration of {len(row)} values for {len(names)} names")
        batches.append((first + offset, tuple(float(value) for value in row)))
    return names, batches


def _opaque_window(window: Any) -> Dict[str, Any]:
    """A report's step window as it came: a JSON object of at most :data:`MAX_WINDOW_BYTES`; raises ``ValueError``
    otherwise."""
    if not isinstance(window, dict) or len(json.dumps(window)) > MAX_WINDOW_BYTES:
        raise ValueError(f"a step window must be a JSON object of at most {MAX_WINDOW_BYTES} bytes")
    return window
