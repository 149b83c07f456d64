"""``ConnectSession``: a Spark Connect client session (no SparkContext, no RDDs, no py4j).

Jobs are DataFrame jobs: plain tasks are a ``mapInArrow`` over
``spark.range(n, numPartitions=n)`` (``barrier=True`` for a barrier stage),
and files reach the executors as session artifacts.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Iterator, List, Optional

from sparktf.errors import SparkTFError
from sparktf.spark.session_kind import SessionKind, TaskFunction

__all__ = ["ConnectSession"]

_LOCAL_THREADS = re.compile(r"^local\[(\d+|\*)(?:,\s*\d+)?\]$")
_PARALLELISM_ATTR = "_sparktf_default_parallelism"
_RESULT_SCHEMA = "result binary"


class _ArrowTasks:
    """``mapInArrow`` function running a :data:`TaskFunction` over its partition's numbers."""

    def __init__(self, function: TaskFunction) -> None:
        self.function = function

    def __call__(self, batches: Iterable[Any]) -> Iterator[Any]:
        import pyarrow as pa

        numbers = (number for batch in batches for number in batch.column(0).to_pylist())
        schema = pa.schema([pa.field("result", pa.binary())])
        for value in self.function(numbers):
            yield pa.RecordBatch.from_pydict({"result": [value]}, schema=schema)


class ConnectSession(SessionKind):
    """A Spark Connect session: settings through ``spark.conf``, jobs over DataFrames."""

    name = "Spark Connect"

    @property
    def conf(self) -> Any:
        return self.session.conf

    def default_parallelism(self) -> int:
        """The server's ``defaultParallelism``: ``spark.range``'s partitions (a one-row job, once per session)."""
        known = getattr(self.session, _PARALLELISM_ATTR, None)
        if known is None:
            from pyspark.sql import functions as F

            probe = self.session.range(1 << 20).select(F.spark_partition_id().alias("p")).agg(F.max("p"))
            known = int(probe.collect()[0][0]) + 1
            setattr(self.session, _PARALLELISM_ATTR, known)
        return known

    def default_fs(self) -> str:
        return self.conf.get("spark.hadoop.fs.defaultFS", None) or "file:///"

    def task_slots(self) -> int:
        """``local[N]``'s N; on a cluster the default parallelism (its cores) over ``spark.task.cpus``."""
        local = _LOCAL_THREADS.match(self.master)
        if local and local.group(1) != "*":
            return int(local.group(1))
        cpus = int(self.conf.get("spark.task.cpus", "1") or 1)
        return max(1, self.default_parallelism() // max(cpus, 1))

    def add_python_file(self, path: str) -> None:
        self.session.addArtifacts(path, pyfile=True)

    @property
    def holder(self) -> Any:
        return self.session

    def run_tasks(self, num_tasks: int, function: TaskFunction, tag: str, barrier: bool = False,
                  description: Optional[str] = None) -> List[Optional[bytes]]:
        self.session.addTag(tag)
        try:
            tasks = self.session.range(0, num_tasks, 1, num_tasks)
            rows = tasks.mapInArrow(_ArrowTasks(function), _RESULT_SCHEMA, barrier=barrier).collect()
            return [row[0] for row in rows]
        finally:
            self.session.removeTag(tag)

    def cancel_tag(self, tag: str) -> None:
        self.session.interruptTag(tag)

    def spark_context(self, what: str, alternative: str) -> Any:
        raise SparkTFError(
            f"{what} needs a SparkContext (RDDs), which a Spark Connect session does not have. {alternative}"
        )
