"""Row gradients of one table summed by id, the same bits on every rank that sums the same arrays."""

from __future__ import annotations

from typing import Tuple

import numpy as np

__all__ = ["merge_rows"]


def merge_rows(indices: np.ndarray, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Sum the rows of equal indices: ``(sorted unique indices, their summed rows)``.

    The sums run in the order the rows come (a stable sort), so every rank
    that merges the same arrays gets the same bits. Made for the rows of a
    few ranks, each holding an index at most once: an index repeats a few
    times at most, and the sum adds its k-th rows for each k in turn.
    """
    if indices.size == 0:
        return indices, rows
    order = np.argsort(indices, kind="stable")
    ordered = indices[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    lengths = np.diff(np.append(starts, ordered.size))
    summed = rows[order[starts]]
    for k in range(1, int(lengths.max())):
        repeated = lengths > k
        summed[repeated] += rows[order[starts[repeated] + k]]
    return ordered[starts], summed
