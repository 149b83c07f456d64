"""One pass over a segment's records: the global batches of a stream's micro-batch.

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
from typing import Optional, Sequence, Tuple

import numpy as np

__all__ = ["SinglePass"]


@dataclass(frozen=True)
class SinglePass:
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

    def on(self, shard_records: Sequence[int]) -> "SinglePass":
        """This pass over shards of ``shard_records``."""
        return SinglePass(self.first_iteration, tuple(int(n) for n in shard_records))

    def start_batch(self, iteration: int) -> int:
        """The index in the pass of the batch after ``iteration`` (where a relaunched reader starts)."""
        return iteration - self.first_iteration

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
