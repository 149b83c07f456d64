"""Record the step timings of a 2-worker run with no slow rank, for ``tests/test_step_anatomy.py``.

The test checks that nobody is named a straggler in windows of a real run's
timings (which carry the machine's jitter), without running 20 Spark jobs.
This trains a small MLP on ``local[2]`` for 400 iterations and writes each
rank's step rows (seconds per column of ``STEP_COLUMNS``) to
``tests/data/step_timings_2_ranks.npz`` as ``steps_<rank>``.

Run ``python benchmarks/record_step_timings.py [output.npz]``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator, List

import numpy as np

STEPS = 400
OUTPUT = os.path.join(os.path.dirname(__file__), os.pardir, "tests", "data", "step_timings_2_ranks.npz")


@contextlib.contextmanager
def recorded_anatomy() -> Iterator[List[Any]]:
    """The ``RankAnatomy`` records of the ``optimize`` calls made inside (which ``optimize`` keeps only as their
    reading), in the list it yields."""
    from sparktf.training.driver import run

    records: List[Any] = []
    reading = run.CallAnatomy

    class Recording(reading):
        def add(self, segment):
            records.extend(segment)
            super().add(segment)

    run.CallAnatomy = Recording
    try:
        yield records
    finally:
        run.CallAnatomy = reading


def main() -> None:
    import keras

    import sparktf
    from sparktf import MaxIteration, TFDataset, TFOptimizer

    sparktf.init_spark("local[2]", app_name="record-step-timings", conf={"spark.driver.host": "127.0.0.1"})
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8192, 32)).astype(np.float32), rng.normal(size=(8192, 1)).astype(np.float32)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, "relu"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with recorded_anatomy() as records:
        TFOptimizer.from_keras(model, TFDataset.from_ndarrays((x, y), batch_size=64), num_workers=2).optimize(
            MaxIteration(STEPS), verbose=0)
    steps = {f"steps_{record.rank}": record.steps for record in records}
    np.savez_compressed(sys.argv[1] if len(sys.argv) > 1 else OUTPUT, **steps)
    print({name: rows.shape for name, rows in steps.items()})


if __name__ == "__main__":
    main()
