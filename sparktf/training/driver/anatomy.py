"""The driver's reading of the ranks' step anatomy: each rank's split of a step, stragglers, and a timeline.

The ranks' :class:`~sparktf.training.worker.step_clock.RankAnatomy` records (one per
rank and segment) give:

* :func:`rank_timings`: seconds per phase and rank, the exchange split into
  **waiting** for the last rank and the **transfer** itself. All ranks leave
  a step's all-reduce together, so the rank that arrived last waited least:
  per step, the transfer is the shortest exchange of any rank, and a rank's
  wait is the rest of its exchange;
* :func:`lost_seconds`: per rank, the seconds the others spent waiting for
  it in the exchange (in each step, the rank that arrived last cost the
  others their waits, and a rank whose bytes were slower to arrive than the
  others' cost every rank the difference);
* :func:`find_stragglers`: a rank whose median seconds in a phase are well
  above the other ranks' median, step after step, or whose lost seconds
  pass a share of the call (a bursty one: a CPU quota's stalls);
* :func:`chrome_trace`: a Chrome-trace / Perfetto JSON of the profiled steps,
  one track per rank.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from sparktf.training.worker.step_clock import STEP_COLUMNS, STEP_PHASES, WINDOW_STATS, RankAnatomy, StepWindow

__all__ = ["Straggler", "CallAnatomy", "ANATOMY_PHASES", "rank_timings", "step_phases", "lost_seconds",
           "find_stragglers", "chrome_trace"]

_LOG = logging.getLogger("sparktf.optimizer")

#: The step phases :func:`rank_timings` gives, the exchange split in two; then parts of the exchange (inside
#: ``exchange_wait`` and ``transfer``, not added to the step): ``send``, what the rank's own sends took; ``receive``,
#: how long it received its left neighbour's bytes once they started to come; ``waited``, all it waited for them;
#: ``delivery``, how long its right neighbour received its bytes (that rank's ``receive``: a slow link or sender
#: shows here, measured where the bytes arrive, even when the sender's socket buffer took them at once).
ANATOMY_PHASES = ("data", "lookup", "compute", "exchange_wait", "transfer", "apply", "send", "receive", "waited",
                  "delivery")
#: A rank is a straggler in a phase when its median step spends this many times the other ranks' median there...
STRAGGLER_FACTOR = 1.5
#: ... and at least this many seconds more per step (below it, timer noise and scheduling jitter dominate).
STRAGGLER_EXCESS = 0.005
#: A rank whose lost seconds (the others' waits for it) pass the other ranks' by this share of the call's step time
#: is named too.
LOST_SHARE = 0.10
#: Steps needed before anyone is named.
MIN_STEPS = 5
#: The live judgement looks at each rank's last windows (about a second each).
LIVE_WINDOWS = 5
# The columns a rank causes itself, and the phase a straggler there is slow in (the exchange's wait is caused by
# the others; its sends, and how fast its bytes arrive, are its own).
_JUDGED = {"data": "data", "lookup": "lookup", "compute": "compute", "send": "exchange", "delivery": "exchange",
           "apply": "apply"}


@dataclass(frozen=True)
class Straggler:
    """A rank that is consistently slower than the others in one phase of the step.

    Attributes
    ----------
    rank : int
    executor, host : str
        Where the rank ran.
    phase : str
        ``"data"``, ``"lookup"``, ``"compute"``, ``"exchange"`` (its sends are slow, or its bytes slow to
        arrive) or ``"apply"``.
    factor : float
        Its median seconds per step in ``phase`` over the other ranks' median (for a rank named by its cost, over
        the steps it made the others wait: its seconds there over theirs).
    lost_seconds : float
        The seconds the other ranks spent waiting for it in the exchange.
    lost_share : float
        ``lost_seconds`` over the call's step time.
    """

    rank: int
    executor: str
    host: str
    phase: str
    factor: float
    lost_seconds: float = 0.0
    lost_share: float = 0.0

    def describe(self) -> str:
        slower = (f"{self.factor:.1f}x slower than the median" if np.isfinite(self.factor)
                  else "slower than the others, who spend no time")
        cost = (f"; the others waited {self.lost_seconds:.1f} s for it ({self.lost_share:.0%} of the call)"
                if self.lost_seconds else "")
        return f"rank {self.rank} (executor {self.executor}, host {self.host}) is {slower} in {self.phase}{cost}"


def _segment_phases(anatomies: Iterable[RankAnatomy]) -> Iterator[Dict[int, np.ndarray]]:
    """Per segment (in order), ``{rank: (steps, len(ANATOMY_PHASES)) seconds}`` over the steps every rank of it ran,
    the exchange split into wait and transfer per step."""
    by_segment: Dict[int, List[RankAnatomy]] = {}
    for record in anatomies:
        by_segment.setdefault(record.first_iteration, []).append(record)
    for first in sorted(by_segment):
        records = by_segment[first]
        steps = min(len(record.steps) for record in records)  # ranks of a segment run the same steps
        if steps == 0:
            continue
        exchange = STEP_PHASES.index("exchange")
        transfer = np.min([record.steps[:steps, exchange] for record in records], axis=0)
        by_rank = {record.rank: record for record in records}
        split = {}
        for rank, right in _right_neighbours(by_rank).items():
            rows = split[rank] = np.zeros((steps, len(ANATOMY_PHASES)))
            for phase in ("data", "lookup", "compute", "apply", "send", "receive", "waited"):
                rows[:, ANATOMY_PHASES.index(phase)] = by_rank[rank].steps[:steps, STEP_COLUMNS.index(phase)]
            rows[:, ANATOMY_PHASES.index("exchange_wait")] = by_rank[rank].steps[:steps, exchange] - transfer
            rows[:, ANATOMY_PHASES.index("transfer")] = transfer
            rows[:, ANATOMY_PHASES.index("delivery")] = by_rank[right].steps[:steps, STEP_COLUMNS.index("receive")]
        yield split


def _right_neighbours(ranks: Iterable[int]) -> Dict[int, int]:
    """``{rank: the rank it sends to}`` on the ring of ``ranks`` (in rank order)."""
    ring = sorted(ranks)
    return {rank: ring[(i + 1) % len(ring)] for i, rank in enumerate(ring)}


def step_phases(anatomies: Iterable[RankAnatomy]) -> Dict[int, np.ndarray]:
    """``{rank: (steps, len(ANATOMY_PHASES)) seconds}`` over the records' segments (in order), the exchange split
    into wait and transfer per step."""
    rows: Dict[int, List[np.ndarray]] = {}
    for segment in _segment_phases(anatomies):
        for rank, split in segment.items():
            rows.setdefault(rank, []).append(split)
    return {rank: np.concatenate(parts) for rank, parts in rows.items()}


def _arrived_last(segment: Dict[int, np.ndarray]) -> Tuple[List[int], np.ndarray, np.ndarray]:
    """The segment's ranks in order, their seconds ``waited`` for their left neighbours per step (ranks x steps),
    and per step the index of the rank that held the others up: the one that waited least."""
    ranks = sorted(segment)
    waits = np.stack([segment[rank][:, ANATOMY_PHASES.index("waited")] for rank in ranks])
    return ranks, waits, np.argmin(waits, axis=0)


def _waits_caused(anatomies: Iterable[RankAnatomy]) -> Dict[int, np.ndarray]:
    """``{rank: seconds per step}`` the other ranks waited for each rank in the exchange, per step the larger of:

    * what it held them up: each other rank's wait for its left neighbour's bytes beyond its own, in the steps it
      waited least (0 in the others): its lateness, and its slowness inside the all-reduce;
    * its link: the seconds its bytes took to arrive beyond the median of the other ranks' (``delivery``), which
      every other rank waits too (a ring moves at its slowest link's pace), while the rank itself may leave the
      all-reduce early and look like it held the others up by a part of it only.
    """
    caused: Dict[int, List[np.ndarray]] = {}
    for segment in _segment_phases(anatomies):
        ranks, waits, last = _arrived_last(segment)
        delivery = np.stack([segment[rank][:, ANATOMY_PHASES.index("delivery")] for rank in ranks])
        others = waits.sum(axis=0) - len(ranks) * waits[last, np.arange(waits.shape[1])]
        for i, rank in enumerate(ranks):
            link = np.zeros(waits.shape[1])  # a rank alone holds nobody up
            if len(ranks) > 1:
                slower = delivery[i] - np.median(np.delete(delivery, i, axis=0), axis=0)
                link = (len(ranks) - 1) * np.maximum(slower, 0.0)
            caused.setdefault(rank, []).append(np.maximum(np.where(last == i, others, 0.0), link))
    return {rank: np.concatenate(parts) for rank, parts in caused.items()}


def lost_seconds(anatomies: Iterable[RankAnatomy]) -> Dict[int, float]:
    """``{rank: seconds}`` the other ranks spent waiting for each rank in the exchange (see :func:`_waits_caused`)."""
    return {rank: float(steps.sum()) for rank, steps in _waits_caused(anatomies).items()}


def rank_timings(anatomies: Sequence[RankAnatomy]) -> Dict[int, Dict[str, float]]:
    """``{rank: {phase: seconds}}`` over the records: the step phases of :data:`ANATOMY_PHASES` and each rank's
    set-up phases (``model_load``, ``warm_up``, ``connect``, ...)."""
    timings: Dict[int, Dict[str, float]] = {}
    for record in anatomies:
        rank = timings.setdefault(record.rank, {})
        for phase, seconds in record.timings.items():
            if phase not in STEP_PHASES:
                rank[phase] = rank.get(phase, 0.0) + seconds
    for rank, rows in step_phases(anatomies).items():
        for i, phase in enumerate(ANATOMY_PHASES):
            timings[rank][phase] = timings[rank].get(phase, 0.0) + float(rows[:, i].sum())
    for rank, seconds in lost_seconds(anatomies).items():
        timings[rank]["lost_seconds"] = seconds
    return timings


def find_stragglers(anatomies: Sequence[RankAnatomy], factor: float = STRAGGLER_FACTOR,
                    excess: float = STRAGGLER_EXCESS, share: float = LOST_SHARE) -> List[Straggler]:
    """The ranks whose median seconds per step in a phase are at least ``factor`` times, and ``excess`` seconds
    more than, the other ranks' median; and the ranks whose lost seconds pass the other ranks' by ``share`` of the
    call's step time (and ``excess`` a step), over at least :data:`MIN_STEPS` steps that made the others wait
    ``excess`` or more, in the phase where they spent the most more than the others in the steps they made them wait.
    The slowest first, each with its lost seconds."""
    rows = step_phases(anatomies)
    places = {record.rank: (record.executor, record.host) for record in anatomies}
    if len(rows) < 2 or min(len(r) for r in rows.values()) < MIN_STEPS:
        return []
    columns = [ANATOMY_PHASES.index(column) for column in _JUDGED]
    medians = {rank: np.median(steps, axis=0)[columns] for rank, steps in rows.items()}
    caused = _waits_caused(anatomies)
    lost = {rank: float(steps.sum()) for rank, steps in caused.items()}
    call = max(float(steps[:, :ANATOMY_PHASES.index("send")].sum()) for steps in rows.values())
    floor = max(share * call, excess * min(len(steps) for steps in rows.values()))  # above timer noise, as medians
    found = {(s.rank, s.phase): s for s in _judged(medians, places, factor, excess)}
    for rank, seconds in lost.items():  # beyond what the others cost: in a healthy run every rank is last at times
        beyond = seconds - float(np.median([other for r, other in lost.items() if r != rank]))
        repeated = int((caused[rank] >= excess).sum()) >= MIN_STEPS  # stalls, not one hiccup (a first step's)
        if call > 0 and beyond >= floor and repeated and not any(key[0] == rank for key in found):
            phase, ratio = _costly_phase(rank, anatomies)
            found[(rank, phase)] = Straggler(rank, *places[rank], phase, ratio)
    return sorted((dataclasses.replace(s, lost_seconds=round(lost.get(s.rank, 0.0), 4),
                                       lost_share=round(lost.get(s.rank, 0.0) / call, 4) if call else 0.0)
                   for s in found.values()), key=lambda straggler: -straggler.factor)


def _costly_phase(rank: int, anatomies: Sequence[RankAnatomy]) -> Tuple[str, float]:
    """The phase where ``rank`` spent the most more than the others in the steps it arrived last in, and its
    seconds there over theirs (per rank)."""
    columns = [ANATOMY_PHASES.index(column) for column in _JUDGED]
    mine, theirs = np.zeros(len(columns)), np.zeros(len(columns))
    for segment in _segment_phases(anatomies):
        if rank not in segment or len(segment) < 2:
            continue
        ranks, _, last = _arrived_last(segment)
        costly = last == ranks.index(rank)
        mine += segment[rank][costly][:, columns].sum(axis=0)
        theirs += np.mean([segment[r][costly][:, columns].sum(axis=0) for r in ranks if r != rank], axis=0)
    best = int(np.argmax(mine - theirs))
    ratio = mine[best] / theirs[best] if theirs[best] > 0 else float("inf")
    return list(_JUDGED.values())[best], round(float(ratio), 2)


def _judged(medians: Dict[int, np.ndarray], places: Dict[int, Tuple[str, str]], factor: float,
            excess: float) -> List[Straggler]:
    """The stragglers among ranks' typical seconds per step (``medians[rank]``: one per ``_JUDGED`` column), the
    slowest first."""
    found = []
    for i, phase in enumerate(_JUDGED.values()):
        for rank, median in medians.items():
            others = float(np.median([m[i] for r, m in medians.items() if r != rank]))
            if median[i] - others >= excess and median[i] >= factor * others:
                ratio = median[i] / others if others > 0 else float("inf")
                found.append(Straggler(rank, *places[rank], phase, round(float(ratio), 2)))
    return sorted(found, key=lambda straggler: -straggler.factor)


def chrome_trace(anatomies: Sequence[RankAnatomy]) -> Dict[str, Any]:
    """The profiled steps' spans as a Chrome-trace JSON object: one track (thread) per rank, one slice per phase of
    each step (``args.iteration``), times in microseconds from the first span."""
    spans = [(record.rank, *span) for record in anatomies for span in record.spans]
    origin = min((span[3] for span in spans), default=0.0)
    events: List[Dict[str, Any]] = []
    for record in sorted({record.rank: record for record in anatomies}.values(), key=lambda r: r.rank):
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": record.rank,
                       "args": {"name": f"rank {record.rank} ({record.host})"}})
    for rank, iteration, phase, start, end in spans:
        events.append({"name": phase, "cat": phase, "ph": "X", "pid": 1,
                       "tid": rank, "ts": round((start - origin) * 1e6, 1), "dur": round((end - start) * 1e6, 1),
                       "args": {"iteration": iteration}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(anatomies: Sequence[RankAnatomy], path: str) -> str:
    """Write :func:`chrome_trace` to the local file ``path``; returns it."""
    with open(path, "w") as out:
        json.dump(chrome_trace(anatomies), out)
    return path


class CallAnatomy:
    """The step anatomy of one ``optimize`` call.

    While a segment runs, :meth:`watch` takes the ranks' step windows (from
    their reports, about once a second) and names a straggler as soon as each
    rank's last :data:`LIVE_WINDOWS` windows show it; after each segment,
    :meth:`add` takes the ranks' whole records. A straggler is logged
    (WARNING) and passed to ``on_straggler`` once per rank and phase in the
    call.

    Parameters
    ----------
    on_straggler : callable, optional
        Called with each newly named :class:`Straggler` (the progress output's line).
    """

    def __init__(self, on_straggler: Optional[Callable[[Straggler], None]] = None) -> None:
        self.records: List[RankAnatomy] = []
        self._named: Dict[Tuple[int, str], Straggler] = {}
        self._windows: Dict[int, Deque[StepWindow]] = {}
        self._on_straggler = on_straggler

    def watch(self, reports: Dict[int, Any]) -> None:
        """Take the step windows of the ranks' reports (see ``JobChannel.reports(take_batches=True)``), naming the
        stragglers they show."""
        for rank, report in reports.items():
            self._windows.setdefault(rank, deque(maxlen=LIVE_WINDOWS)).extend(_read_windows(rank, report.windows))
        windows = {rank: list(kept) for rank, kept in self._windows.items() if kept}
        if len(windows) < 2 or min(sum(w.count for w in kept) for kept in windows.values()) < MIN_STEPS:
            return
        p50 = WINDOW_STATS.index("p50")
        columns = [STEP_COLUMNS.index("receive" if column == "delivery" else column) for column in _JUDGED]
        measured = {rank: np.median(np.repeat([[w.stats[c][p50] for c in columns] for w in kept],
                                              [w.count for w in kept], axis=0), axis=0)  # windows weigh by steps
                    for rank, kept in windows.items()}
        delivery = list(_JUDGED).index("delivery")  # a rank's delivery is its right neighbour's receive
        medians = {rank: np.concatenate([measured[rank][:delivery], measured[right][delivery:delivery + 1],
                                         measured[rank][delivery + 1:]])
                   for rank, right in _right_neighbours(measured).items()}
        places = {rank: (kept[-1].executor, kept[-1].executor.rsplit(":", 1)[0]) for rank, kept in windows.items()}
        self._name(_judged(medians, places, STRAGGLER_FACTOR, STRAGGLER_EXCESS))

    def add(self, records: Sequence[RankAnatomy]) -> None:
        """Take a segment's records, naming its new stragglers; the next segment's windows start afresh."""
        self.records.extend(records)
        self._windows.clear()
        self._name(find_stragglers(records))

    def rank_timings(self) -> Dict[int, Dict[str, float]]:
        return rank_timings(self.records)

    def stragglers(self) -> List[Straggler]:
        """The call's stragglers, the slowest first: those its records show, and those named while it ran."""
        found = {(s.rank, s.phase): s for s in self._named.values()}
        found.update({(s.rank, s.phase): s for s in find_stragglers(self.records)})
        return sorted(found.values(), key=lambda straggler: -straggler.factor)

    def write_timeline(self, folder: str, steps: Tuple[int, int]) -> str:
        """Write the profiled steps' timeline to ``folder/timeline-<start>-<end>.json``; returns its path."""
        os.makedirs(folder, exist_ok=True)
        return write_chrome_trace(self.records, os.path.join(folder, f"timeline-{steps[0]}-{steps[1]}.json"))

    def _name(self, found: Sequence[Straggler]) -> None:
        for straggler in found:
            if (straggler.rank, straggler.phase) not in self._named:
                self._named[(straggler.rank, straggler.phase)] = straggler
                _LOG.warning("%s: %s", straggler.describe(), _ADVICE[straggler.phase])
                if self._on_straggler is not None:
                    self._on_straggler(straggler)


#: What to do about a straggler in each phase (see docs/guides/training.md, "Why is it slow?").
_ADVICE = {
    "data": "its input is slower (a larger or skewed partition, a slow read): repartition the data evenly",
    "lookup": "its share of the sharded tables' lookups is larger: shard the tables over more workers",
    "compute": "its host computes slower (a busy or slower machine): exclude the host or give it fewer tasks",
    "exchange": "its sends, or its bytes' arrival at the next rank, are slower (its network link or host): check "
                "the host's link, or send less (gradient_compression)",
    "apply": "its update is slower (a busy host): exclude the host or give it fewer tasks",
}


def _read_windows(rank: int, windows: Sequence[Any]) -> List[StepWindow]:
    """The step windows of rank ``rank``'s report (as the channel carried them), a malformed one left out."""
    read = []
    for window in windows:
        try:
            read.append(StepWindow.from_wire(window))
        except (ValueError, TypeError, KeyError) as error:
            _LOG.debug("rank %d sent a malformed step window (%s): left out", rank, error)
    return read
