"""``ClassicSession``: a SparkSession with its SparkContext and JVM in this process."""

from __future__ import annotations

import os
import secrets
import tempfile
from typing import Any, List, Optional

from sparktf.spark.cluster import TaskSlots, size_setting, task_slots, total_task_slots
from sparktf.spark.session_kind import SessionKind, Shared, TaskFunction

__all__ = ["ClassicSession", "FileShare", "SHARE_FILE_BYTES_CONF"]

#: From this many bytes on, ``share`` ships a file instead of a broadcast.
SHARE_FILE_BYTES_CONF = "spark.sparktf.shareFileBytes"
DEFAULT_SHARE_FILE_BYTES = "64m"


class FileShare(Shared):
    """Bytes shipped as a file added with ``SparkContext.addFile``: each executor fetches it once from the driver's
    file server, which streams it from disk (never through the JVM heap or the block manager), and keeps it in its
    work folder; a Python worker reads it when it needs the bytes.

    The driver's copy lives in a folder of its own as long as this object (held by the predictor, its RDDs and
    DataFrames), or until :meth:`destroy`.
    """

    def __init__(self, file_name: str, folder: Optional[tempfile.TemporaryDirectory] = None) -> None:
        self.file_name = file_name
        self._folder = folder  # the driver's copy; never pickled

    @classmethod
    def written(cls, sc: Any, data: bytes, name: str) -> "FileShare":
        """``data`` written to a new folder and added to ``sc`` (a name of its own: Spark refuses a name twice)."""
        folder = tempfile.TemporaryDirectory(prefix="sparktf-share-")
        file_name = f"sparktf-{name}-{secrets.token_hex(8)}.bin"
        path = os.path.join(folder.name, file_name)
        with open(path, "wb") as file:
            file.write(data)
        sc.addFile(path)
        return cls(file_name, folder)

    def __getstate__(self) -> dict:
        return {"file_name": self.file_name, "_folder": None}

    @property
    def value(self) -> bytes:
        from pyspark import SparkFiles

        with open(SparkFiles.get(self.file_name), "rb") as file:
            return file.read()

    def destroy(self) -> None:
        if self._folder is not None:
            self._folder.cleanup()


class ClassicSession(SessionKind):
    """A classic session: RDDs, broadcasts and the JVM through py4j."""

    name = "classic"

    def __init__(self, session: Any) -> None:
        super().__init__(session)
        self.sc = session.sparkContext

    @property
    def conf(self) -> Any:
        # the context's own SparkConf: one py4j call per ``get`` (``getConf()`` copies every entry over py4j)
        return self.sc._conf

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
        """A broadcast variable (``value``, ``destroy``); from ``spark.sparktf.shareFileBytes`` (default 64m) on, a
        file Spark's file server streams to each executor once (:class:`FileShare`): a broadcast's blocks would
        sit in the driver's JVM heap."""
        if len(data) < size_setting(self, SHARE_FILE_BYTES_CONF, DEFAULT_SHARE_FILE_BYTES):
            return self.sc.broadcast(data)
        return FileShare.written(self.sc, data, name)

    def add_python_file(self, path: str) -> None:
        self.sc.addPyFile(path)

    @property
    def holder(self) -> Any:
        return self.sc

    @staticmethod
    def holder_stopped(holder: Any) -> bool:
        return holder._jsc is None

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
