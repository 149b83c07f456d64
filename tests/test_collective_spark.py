"""The collective inside real Spark barrier tasks (``local[2]``)."""

import secrets

import numpy as np


def test_allreduce_inside_spark_barrier_tasks(sc):
    secret = secrets.token_bytes(32)  # created on the driver, shipped in the task closure

    def train_partition(_):
        from pyspark import BarrierTaskContext

        from sparktf.collective import Communicator

        ctx = BarrierTaskContext.get()
        with Communicator.from_barrier_context(ctx, secret, timeout=60) as comm:
            gradient = np.arange(1000003, dtype=np.float32) * (comm.rank + 1)
            comm.allreduce(gradient, op="mean")
            counts = comm.allreduce(np.array([comm.rank + 10], dtype=np.int64), op="sum")
            ranks = comm.allgather_object(comm.rank)
            comm.barrier()
            expected = np.arange(1000003, dtype=np.float32) * 1.5
            yield (comm.rank, comm.world_size, bool(np.allclose(gradient, expected)), int(counts[0]), ranks)

    results = sorted(sc.parallelize(range(2), 2).barrier().mapPartitions(train_partition).collect())
    assert results == [(0, 2, True, 21, [0, 1]), (1, 2, True, 21, [0, 1])]
