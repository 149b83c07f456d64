"""Leading runs of tokens that prompts of a window share, found so that each run is prefilled once.

Prompts built from a few templates (a system prompt, a few-shot preamble)
start with the same tokens. :meth:`SharedRuns.find` sorts a window's rows by
their tokens: rows whose tokens agree on a leading run of at least
``minimum`` tokens are then neighbours, and a chain of such neighbours is a
*group*, whose run is the leading run all its rows share. The engine
prefills every group's run once per window (all of them in one prefill) and
starts each batch of grouped rows from its rows' runs, gathered
(:meth:`SharedRuns.batch_start` tells from where); rows in no group are batched
as before. The sorting and comparing are NumPy on the tokens, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["MIN_SHARED_RUN", "SharedRuns"]

#: The fewest tokens rows must share beyond a given ``prefix=`` for their run to be prefilled once.
MIN_SHARED_RUN = 32


def _common(one: np.ndarray, two: np.ndarray) -> int:
    """The tokens ``one`` and ``two`` share from their start."""
    length = min(len(one), len(two))
    differ = np.flatnonzero(one[:length] != two[:length])
    return int(differ[0]) if len(differ) else length


@dataclass(frozen=True)
class SharedRuns:
    """The groups of a window's rows that share a leading run of tokens (see the module docstring).

    Attributes
    ----------
    groups : numpy.ndarray
        Each row's group, ``-1`` for a row in none.
    runs : numpy.ndarray
        Each group's run: the tokens all its rows share from their start (the
        start token and a given prefix included).
    token_ids : numpy.ndarray
        ``[groups, longest run]``: each group's run, padded with zeros.
    known : int
        The tokens every row starts with anyway (a given ``prefix=``'s, whose
        cache exists): no saving of a run's.
    """

    groups: np.ndarray
    runs: np.ndarray
    token_ids: np.ndarray
    known: int

    @classmethod
    def find(cls, token_ids: Sequence[np.ndarray], minimum: int = MIN_SHARED_RUN, known: int = 0) -> "SharedRuns":
        """The groups of rows (``token_ids``, one array per row) sharing at least ``known + minimum`` leading tokens.

        Rows sorted by their tokens; a group is a longest chain of neighbours
        that share so many, and its run what the whole chain shares.
        """
        order = sorted(range(len(token_ids)), key=lambda row: tuple(token_ids[row]))
        shared = [_common(token_ids[one], token_ids[two]) for one, two in zip(order, order[1:])]
        groups = np.full(len(token_ids), -1, np.int64)
        runs = []
        for position, common in enumerate(shared):
            if common < known + minimum:
                continue
            if groups[order[position]] < 0:  # a chain starts
                groups[order[position]] = len(runs)
                runs.append(common)
            groups[order[position + 1]] = len(runs) - 1
            runs[-1] = min(runs[-1], common)
        padded = np.zeros((len(runs), max(runs, default=0)), np.int64)
        for row in np.flatnonzero(groups >= 0):
            padded[groups[row], :runs[groups[row]]] = token_ids[row][:runs[groups[row]]]
        return cls(groups, np.asarray(runs, np.int64), padded, known)

    def __bool__(self) -> bool:
        """Whether any rows share a run."""
        return len(self.runs) > 0

    def possible(self) -> int:
        """The prefill tokens the runs can save: every grouped row's run beyond ``known``, less one prefill per run."""
        grouped = self.groups[self.groups >= 0]
        return int((self.runs[grouped] - self.known).sum() - (self.runs - self.known).sum())

    def batch_start(self, groups: Sequence[int]) -> int:
        """Where a batch of rows in ``groups`` (each row's) can start its prefill from the runs' cache: its shortest
        run (0 when a row is in no group)."""
        groups = np.asarray(groups)
        return 0 if (groups < 0).any() else int(self.runs[groups].min())
