"""How a segment's ranks read their batches: endlessly, in epochs (:class:`EndlessBatches`), or once, the global
batches of a stream's micro-batch (:class:`SinglePass`). Made on the driver, read on the workers.

A training segment normally reads its workers' shards endlessly, in batches
of exactly the local batch size. A :class:`SinglePass` segment (one
micro-batch of ``TFOptimizer.optimize_stream``) uses each record once, in
``ceil(n / batch_size)`` global batches whatever the number of workers: the
shards are cut for it (``BlockDataset.one_pass``), so rank ``r`` takes its
local batch ``b_r`` for every full global batch and its part of the last,
partial one. That batch keeps its shape (the step is not traced again): the
rows past a shard's end are filled from the reader's next pass and weighted
0 by a mask of sample weights.

Keras reduces a weighted loss over all the batch's rows, so a rank's masked
loss is its real records' loss sum over ``b_r``; scaling it by ``b_r / R``,
where ``R`` is the records of the global batch over every rank, makes the
all-reduced sum the mean over the global batch's records: the gradient of
that batch alone. TensorFlow-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

__all__ = ["BatchSchedule", "EndlessBatches", "SinglePass"]


class BatchSchedule:
    """Where a segment's ranks start reading, what each batch weighs, and whether the segment may grow back."""

    #: Whether a launch on fewer workers may end at an epoch's end to grow back there.
    grows_back = True

    def on(self, shard_records: Callable[[], Sequence[int]]) -> "BatchSchedule":
        """The schedule of a launch whose ranks' shards hold ``shard_records()`` records."""
        return self

    def start_batch(self, iteration: int) -> int:
        """The index of the batch after ``iteration`` in the ranks' streams (where a relaunched reader starts)."""
        return iteration

    def weights(self, rank: int, iteration: int, local_batches: Sequence[int],
                sample_weight: Optional[np.ndarray]) -> Tuple[float, Optional[np.ndarray]]:
        """``(weight, sample_weight)`` of rank ``rank``'s batch at absolute ``iteration``: its share of the global
        batch (the step scales its loss and gradients by it) and the batch's sample weights."""
        return local_batches[rank] / sum(local_batches), sample_weight

    def warm_up_weights(self, sample_weight: Optional[np.ndarray], batch: int) -> Optional[np.ndarray]:
        """The sample weights of a warm-up batch, as the segment's batches will carry them (one traced step)."""
        return sample_weight


class EndlessBatches(BatchSchedule):
    """A segment that reads its shards endlessly, in batches of exactly the local batch size (epochs)."""


@dataclass(frozen=True)
class SinglePass(BatchSchedule):
    """A segment that reads its shards once.

    Attributes
    ----------
    first_iteration : int
        The absolute iteration before the pass (its first batch is the next).
    shard_records : tuple of int
        Records of each rank's shard (set for each launch: it depends on its worker count).
    """

    first_iteration: int
    shard_records: Tuple[int, ...] = ()

    grows_back = False

    def on(self, shard_records: Callable[[], Sequence[int]]) -> "SinglePass":
        """This pass over shards of ``shard_records()`` records."""
        return SinglePass(self.first_iteration, tuple(int(n) for n in shard_records()))

    def start_batch(self, iteration: int) -> int:
        return iteration - self.first_iteration

    def weights(self, rank: int, iteration: int, local_batches: Sequence[int],
                sample_weight: Optional[np.ndarray]) -> Tuple[float, Optional[np.ndarray]]:
        """The pass's last batch is partial: its fill weighs nothing (see the module's docstring)."""
        weight, mask = self.step(rank, iteration, local_batches)
        return weight, self.masked(mask, sample_weight, local_batches[rank])

    def warm_up_weights(self, sample_weight: Optional[np.ndarray], batch: int) -> Optional[np.ndarray]:
        """A pass's batches all carry weights."""
        return self.masked(None, sample_weight, batch)

    def step(self, rank: int, iteration: int, local_batches: Sequence[int]) -> Tuple[float, Optional[np.ndarray]]:
        """``(weight, mask)`` of rank ``rank``'s batch at absolute ``iteration``.

        ``weight`` scales the rank's loss and gradients (see the module's
        docstring); ``mask`` is 1.0 for its real records and 0.0 for the fill
        (None when the whole batch is real).
        """
        index = iteration - 1 - self.first_iteration
        real = [_real(n, b, index) for n, b in zip(self.shard_records, local_batches)]
        batch = local_batches[rank]
        weight = batch / max(1, sum(real))
        if real[rank] == batch:
            return weight, None
        mask = np.zeros(batch, np.float32)
        mask[: real[rank]] = 1.0
        return weight, mask

    def masked(self, mask: Optional[np.ndarray], sample_weight: Optional[np.ndarray], batch: int) -> np.ndarray:
        """The batch's sample weights with ``mask`` applied (ones when there are none: one traced signature)."""
        weights = np.ones(batch, np.float32) if mask is None else mask
        return weights if sample_weight is None else weights * np.asarray(sample_weight, np.float32)


def _real(records: int, batch: int, index: int) -> int:
    """Real records in batch ``index`` of a shard of ``records`` read in batches of ``batch``."""
    return max(0, min(batch, records - index * batch))
