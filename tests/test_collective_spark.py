"""The collective inside real Spark barrier tasks (``local[2]``)."""

import contextlib
import secrets

import numpy as np
import pytest

from sparktf.collective import JobChannel


@pytest.mark.parametrize("rendezvous", ["directory", "allGather"])
def test_allreduce_inside_spark_barrier_tasks(sc, rendezvous):
    secret = secrets.token_bytes(32)  # created on the driver, shipped in the task closure
    with contextlib.ExitStack() as stack:
        directory = None
        if rendezvous == "directory":
            directory = stack.enter_context(JobChannel(2, secret, "127.0.0.1")).address
        results = sorted(run_barrier_allreduce(sc, secret, directory))
    assert results == [(0, 2, True, 21, [0, 1], [1, None]), (1, 2, True, 21, [0, 1], [1, None])]


def run_barrier_allreduce(sc, secret, directory):
    """Two barrier tasks connect (through ``directory`` or allGather; rank 0 claims 1) and run every collective."""

    def train_partition(_):
        from pyspark import BarrierTaskContext

        from sparktf.collective import Communicator

        ctx = BarrierTaskContext.get()
        claim = 1 if ctx.partitionId() == 0 else None
        with Communicator.from_barrier_context(ctx, secret, timeout=60, directory=directory, claim=claim) as comm:
            gradient = np.arange(1000003, dtype=np.float32) * (comm.rank + 1)
            comm.allreduce(gradient, op="mean")
            counts = comm.allreduce(np.array([comm.rank + 10], dtype=np.int64), op="sum")
            ranks = comm.allgather_object(comm.rank)
            comm.barrier()
            expected = np.arange(1000003, dtype=np.float32) * 1.5
            yield (comm.rank, comm.world_size, bool(np.allclose(gradient, expected)), int(counts[0]), ranks, comm.claims)

    return sc.parallelize(range(2), 2).barrier().mapPartitions(train_partition).collect()
