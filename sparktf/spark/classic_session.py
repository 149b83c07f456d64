"""``ClassicSession``: a SparkSession with its SparkContext and JVM in this process."""

from __future__ import annotations

from typing import Any, List, Optional

from sparktf.spark.cluster import TaskSlots, task_slots, total_task_slots
from sparktf.spark.session_kind import SessionKind, Shared, TaskFunction

__all__ = ["ClassicSession"]


class ClassicSession(SessionKind):
    """A classic session: RDDs, broadcasts and the JVM through py4j."""

    name = "classic"

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self.sc = session.sparkContext

    @property
    def conf(self) -> Any:
        return self.sc.getConf()

    def setting(self, key: str, default: str) -> str:
        return self.sc.getLocalProperty(key) or self.conf.get(key, default)

    @property
    def master(self) -> str:
        return self.sc.master

    def default_parallelism(self) -> int:
        return int(self.sc.defaultParallelism)

    def default_fs(self) -> str:
        return self.sc._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"

    def task_slots(self) -> int:
        return total_task_slots(self.sc)

    def slots(self, profile: Any = None) -> TaskSlots:
        return task_slots(self.sc, profile)

    def register_profile(self, profile: Any) -> Any:
        """The profile as Spark registered it, through a one-partition RDD (``withResources``) that never runs."""
        from pyspark.resource import ResourceProfile

        probe = self.sc.parallelize([0], 1)
        probe.withResources(profile)
        return ResourceProfile(_java_resource_profile=probe._jrdd.getResourceProfile())

    def share(self, data: bytes, name: str) -> Shared:
        """A broadcast variable (``value``, ``destroy``)."""
        return self.sc.broadcast(data)

    def add_python_file(self, path: str) -> None:
        self.sc.addPyFile(path)

    @property
    def holder(self) -> Any:
        return self.sc

    def add_tag(self, tag: str) -> None:
        self.sc.addJobTag(tag)

    def remove_tag(self, tag: str) -> None:
        self.sc.removeJobTag(tag)

    def run_tasks(self, num_tasks: int, function: TaskFunction, tag: str, barrier: bool = False,
                  description: Optional[str] = None) -> List[Optional[bytes]]:
        with self.tagged(tag):
            if description:
                self.sc.setJobDescription(description)
            try:
                tasks = self.sc.parallelize(range(num_tasks), num_tasks)
                return (tasks.barrier() if barrier else tasks).mapPartitions(function).collect()
            finally:
                if description:
                    self.sc.setJobDescription(None)

    def cancel_tag(self, tag: str) -> None:
        self.sc.cancelJobsWithTag(tag)

    def spark_context(self, what: str, alternative: str) -> Any:
        return self.sc
