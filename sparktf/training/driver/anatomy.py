"""The driver's reading of the ranks' step anatomy: each rank's split of a step, stragglers, and a timeline.

The ranks' :class:`~sparktf.training.worker.step_clock.RankAnatomy` records (one per
rank and segment) give:

* :func:`rank_timings`: seconds per phase and rank, the exchange split into
  **waiting** for the last rank and the **transfer** itself. All ranks leave
  a step's all-reduce together, so the rank that arrived last waited least:
  per step, the transfer is the shortest exchange of any rank, and a rank's
  wait is the rest of its exchange;
* :func:`find_stragglers`: a rank whose median seconds in a phase are well
  above the other ranks' median, step after step;
* :func:`chrome_trace`: a Chrome-trace / Perfetto JSON of the profiled steps,
  one track per rank.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from sparktf.collective.channel import StepWindow
from sparktf.training.worker.step_clock import STEP_COLUMNS, STEP_PHASES, WINDOW_STATS, RankAnatomy

__all__ = ["Straggler", "CallAnatomy", "ANATOMY_PHASES", "rank_timings", "step_phases", "find_stragglers",
           "chrome_trace"]

_LOG = logging.getLogger("sparktf.optimizer")

#: The step phases :func:`rank_timings` gives, the exchange split in two; then ``send``, the part of the exchange
#: the rank's own sends took (inside ``exchange_wait`` and ``transfer``, not added to the step).
ANATOMY_PHASES = ("data", "lookup", "compute", "exchange_wait", "transfer", "apply", "send")
#: A rank is a straggler in a phase when its median step spends this many times the other ranks' median there...
STRAGGLER_FACTOR = 1.5
#: ... and at least this many seconds more per step (below it, timer noise and scheduling jitter dominate).
STRAGGLER_EXCESS = 0.005
#: Steps needed before anyone is named.
MIN_STEPS = 5
#: The live judgement looks at each rank's last windows (about a second each).
LIVE_WINDOWS = 5
# The columns a rank causes itself, and the phase a straggler there is slow in (the exchange's wait is caused by
# the others; its sends are its own).
_JUDGED = {"data": "data", "lookup": "lookup", "compute": "compute", "send": "exchange", "apply": "apply"}


@dataclass(frozen=True)
class Straggler:
    """A rank that is consistently slower than the others in one phase of the step.

    Attributes
    ----------
    rank : int
    executor, host : str
        Where the rank ran.
    phase : str
        ``"data"``, ``"lookup"``, ``"compute"``, ``"exchange"`` (its sends are slow) or ``"apply"``.
    factor : float
        Its median seconds per step in ``phase`` over the other ranks' median.
    """

    rank: int
    executor: str
    host: str
    phase: str
    factor: float

    def describe(self) -> str:
        return (f"rank {self.rank} (executor {self.executor}, host {self.host}) is {self.factor:.1f}x slower than "
                f"the median in {self.phase}")


def step_phases(anatomies: Iterable[RankAnatomy]) -> Dict[int, np.ndarray]:
    """``{rank: (steps, len(ANATOMY_PHASES)) seconds}`` over the records' segments (in order), the exchange split
    into wait and transfer per step."""
    by_segment: Dict[int, List[RankAnatomy]] = {}
    for record in anatomies:
        by_segment.setdefault(record.first_iteration, []).append(record)
    rows: Dict[int, List[np.ndarray]] = {}
    for first in sorted(by_segment):
        records = by_segment[first]
        steps = min(len(record.steps) for record in records)  # ranks of a segment run the same steps
        if steps == 0:
            continue
        exchange = STEP_PHASES.index("exchange")
        transfer = np.min([record.steps[:steps, exchange] for record in records], axis=0)
        for record in records:
            split = np.zeros((steps, len(ANATOMY_PHASES)))
            for phase in ("data", "lookup", "compute", "apply", "send"):
                split[:, ANATOMY_PHASES.index(phase)] = record.steps[:steps, STEP_COLUMNS.index(phase)]
            split[:, ANATOMY_PHASES.index("exchange_wait")] = record.steps[:steps, exchange] - transfer
            split[:, ANATOMY_PHASES.index("transfer")] = transfer
            rows.setdefault(record.rank, []).append(split)
    return {rank: np.concatenate(parts) for rank, parts in rows.items()}


def rank_timings(anatomies: Sequence[RankAnatomy]) -> Dict[int, Dict[str, float]]:
    """``{rank: {phase: seconds}}`` over the records: the step phases of :data:`ANATOMY_PHASES` and each rank's
    set-up phases (``model_load``, ``warm_up``, ``connect``, ...)."""
    timings: Dict[int, Dict[str, float]] = {}
    step_laps = {"batches", "lookup", "compute", "allreduce", "apply"}
    for record in anatomies:
        rank = timings.setdefault(record.rank, {})
        for phase, seconds in record.timings.items():
            if phase not in step_laps:
                rank[phase] = rank.get(phase, 0.0) + seconds
    for rank, rows in step_phases(anatomies).items():
        for i, phase in enumerate(ANATOMY_PHASES):
            timings[rank][phase] = timings[rank].get(phase, 0.0) + float(rows[:, i].sum())
    return timings


def find_stragglers(anatomies: Sequence[RankAnatomy], factor: float = STRAGGLER_FACTOR,
                    excess: float = STRAGGLER_EXCESS) -> List[Straggler]:
    """The ranks whose median seconds per step in a phase are at least ``factor`` times, and ``excess`` seconds
    more than, the other ranks' median (the slowest first)."""
    rows = step_phases(anatomies)
    places = {record.rank: (record.executor, record.host) for record in anatomies}
    if len(rows) < 2 or min(len(r) for r in rows.values()) < MIN_STEPS:
        return []
    columns = [ANATOMY_PHASES.index(column) for column in _JUDGED]
    medians = {rank: np.median(steps, axis=0)[columns] for rank, steps in rows.items()}
    return _judged(medians, places, factor, excess)


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
        events.append({"name": "all-reduce" if phase == "exchange" else phase, "cat": phase, "ph": "X", "pid": 1,
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
            self._windows.setdefault(rank, deque(maxlen=LIVE_WINDOWS)).extend(report.windows)
        windows = {rank: list(kept) for rank, kept in self._windows.items() if kept}
        if len(windows) < 2 or min(sum(w.count for w in kept) for kept in windows.values()) < MIN_STEPS:
            return
        p50 = WINDOW_STATS.index("p50")
        columns = [STEP_COLUMNS.index(column) for column in _JUDGED]
        medians = {rank: np.median(np.repeat([[w.stats[c][p50] for c in columns] for w in kept],
                                             [w.count for w in kept], axis=0), axis=0)  # windows weigh by steps
                   for rank, kept in windows.items()}
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
    "exchange": "its sends are slower (its network link or host): check the host's link, or send less "
                "(gradient_compression)",
    "apply": "its update is slower (a busy host): exclude the host or give it fewer tasks",
}
