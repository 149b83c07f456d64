"""A training rank's clock: seconds per phase of the segment, per phase of each step, and the profiled steps' spans.

Each rank of a segment keeps one :class:`PhaseClock`. ``lap(phase)`` ends the
phase running since the last lap: its seconds add to the segment's totals
(``timings``) and, for the step phases (:data:`STEP_PHASES`), to the current
step's row, whose last columns (``send``, ``receive``, ``waited``) hold parts
of the exchange: its own sends, receiving and waiting for its left neighbour. The rows (a few floats
per step) and the wall-clock spans of the steps in ``profile_steps`` travel to
the driver with the segment's results as a :class:`RankAnatomy`, which
:mod:`sparktf.training.driver.anatomy` reads. While the segment runs,
:meth:`PhaseClock.take_window` summarises the rows kept since its last call
(the heartbeat sends that to the driver about once a second).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["STEP_PHASES", "STEP_COLUMNS", "WINDOW_STATS", "PhaseClock", "RankAnatomy", "StepWindow",
           "window_summary"]

#: The phases of a step, one name each wherever they show (the clock's laps, ``last_timings``, the heartbeat, the
#: anatomy, the timeline): waiting for the batch, the tables' lookup, the forward and backward pass, the gradient
#: exchange, and the update.
STEP_PHASES = ("data", "lookup", "compute", "exchange", "apply")
#: A step row's columns: the phases, then parts of the exchange (``RingLink.wire_seconds``): the seconds this rank's
#: sends took, those it spent receiving its left neighbour's bytes once they started to come, and all it waited for
#: them.
STEP_COLUMNS = STEP_PHASES + ("send", "receive", "waited")
#: What a window's summary gives per column, over its steps.
WINDOW_STATS = ("mean", "p50", "p95", "max")


@dataclass
class RankAnatomy:
    """What one rank measured in a segment.

    Attributes
    ----------
    rank : int
    executor, host : str
        Where the rank ran (the executor's address as Spark gives it, and its host).
    timings : dict
        Seconds per phase over the segment (the step phases and the set-up ones).
    steps : numpy.ndarray
        ``(steps, len(STEP_COLUMNS))`` seconds, one row per step in order.
    first_iteration : int
        The iteration of the first row.
    spans : list
        ``(iteration, phase, start, end)`` wall-clock spans (``time.time()``) of the profiled steps.
    """

    rank: int
    executor: str
    host: str
    timings: Dict[str, float]
    steps: np.ndarray
    first_iteration: int
    spans: List[Tuple[int, str, float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class StepWindow:
    """A summary of a rank's step timings over a window of consecutive steps (about a second's), as
    :func:`window_summary` writes it and the driver reads it from a report (the channel carries it opaque).

    Attributes
    ----------
    executor : str
        Where the rank runs (``host:port`` as Spark gives it).
    first : int
        The window's first iteration.
    count : int
        Its steps.
    stats : tuple
        Per step column (:data:`STEP_COLUMNS`), seconds: one value per :data:`WINDOW_STATS`.
    """

    executor: str
    first: int
    count: int
    stats: Tuple[Tuple[float, ...], ...]

    @classmethod
    def from_wire(cls, message: Any) -> "StepWindow":
        """Read a :func:`window_summary`; raises ``ValueError``, ``TypeError`` or ``KeyError`` when it is malformed."""
        stats = tuple(tuple(float(value) for value in column) for column in message["stats"])
        if len(stats) != len(STEP_COLUMNS) or any(len(column) != len(WINDOW_STATS) for column in stats):
            raise ValueError("a step window of the wrong shape")
        count = int(message["count"])
        if count < 1:
            raise ValueError(f"a step window of {count} steps")
        return cls(str(message["executor"]), int(message["first"]), count, stats)


def window_summary(rows: np.ndarray, executor: str, first: int) -> Dict[str, Any]:
    """The summary :meth:`PhaseClock.take_window` gives of step ``rows`` (``(steps, len(STEP_COLUMNS))``) from
    iteration ``first``."""
    stats = np.stack([rows.mean(axis=0), *np.percentile(rows, [50, 95], axis=0), rows.max(axis=0)], axis=1)
    return {"executor": executor, "first": first, "count": len(rows), "stats": stats.round(7).tolist()}


class PhaseClock:
    """Times a rank's phases (see the module docstring).

    Parameters
    ----------
    profile_steps : tuple of int, optional
        ``(start, end)``: the iterations whose phases' wall-clock spans are kept.
    """

    def __init__(self, profile_steps: Optional[Tuple[int, int]] = None):
        self.seconds: Dict[str, float] = {}
        self._profile = profile_steps
        self._last = time.perf_counter()
        self._wall_offset = time.time() - self._last
        self._rows: List[np.ndarray] = []
        self._row: Optional[np.ndarray] = None
        self._iteration = 0
        self._first_iteration = 0
        self._spans: List[Tuple[int, str, float, float]] = []
        self._windowed = 0  # rows summarised by take_window so far

    def lap(self, phase: str) -> float:
        """End the phase running since the last lap as ``phase``; returns the time (``perf_counter``)."""
        now = time.perf_counter()
        elapsed = now - self._last
        self.seconds[phase] = self.seconds.get(phase, 0.0) + elapsed
        if self._row is not None and phase in STEP_PHASES:
            self._row[STEP_PHASES.index(phase)] += elapsed
            if self._profile is not None and self._profile[0] <= self._iteration <= self._profile[1]:
                self._spans.append((self._iteration, phase, self._last + self._wall_offset,
                                    now + self._wall_offset))
        self._last = now
        return now

    def add(self, column: str, seconds: float) -> None:
        """Add ``seconds`` to the current step's ``column`` (one of :data:`STEP_COLUMNS` that is not a lap)."""
        if self._row is not None:
            self._row[STEP_COLUMNS.index(column)] += seconds

    def step(self, iteration: int) -> None:
        """Start timing ``iteration``'s step phases (the previous step's row is kept)."""
        self.end_step()
        if not self._rows:
            self._first_iteration = iteration
        self._iteration = iteration
        self._row = np.zeros(len(STEP_COLUMNS), np.float64)

    def end_step(self) -> None:
        """Keep the current step's row (a step that ended without its update is not kept)."""
        if self._row is not None and self._row[STEP_PHASES.index("apply")] > 0:
            self._rows.append(self._row)
        self._row = None

    def take_window(self, executor: str) -> Optional[Dict[str, Any]]:
        """A summary of the steps kept since the previous call (None: no new step), for the driver:
        ``{"executor", "first", "count", "stats"}``, ``stats`` one list of :data:`WINDOW_STATS` per column of
        :data:`STEP_COLUMNS`. Safe to call from another thread than the one that times."""
        kept = len(self._rows)
        if kept <= self._windowed:
            return None
        rows = np.array(self._rows[self._windowed:kept], np.float64)
        first, self._windowed = self._first_iteration + self._windowed, kept
        return window_summary(rows, executor, first)

    def anatomy(self, rank: int, executor: str, host: str) -> RankAnatomy:
        """What this clock measured, for the driver."""
        self.end_step()
        steps = np.array(self._rows, np.float64).reshape(-1, len(STEP_COLUMNS))
        return RankAnatomy(rank, executor, host, dict(self.seconds), steps, self._first_iteration, list(self._spans))
