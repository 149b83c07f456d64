"""``RunContext``: the ``ctx`` argument of ``main_fun(args, ctx)``.

Its field names are TensorFlowOnSpark's, so converted programs keep working.
It is plain data (no Spark objects), pickled into the child process.
"""

from __future__ import annotations

import getpass
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

__all__ = ["RunContext", "absolute_path"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def absolute_path(path: str, default_fs: str, working_dir: str) -> str:
    """Resolve ``path`` the way TensorFlowOnSpark's ``TFNode.hdfs_path`` does.

    Parameters
    ----------
    path : str
        A path with a scheme (``hdfs://...``, ``gs://...``, ``file://...``),
        an absolute path, or a relative one.
    default_fs : str
        Hadoop's ``fs.defaultFS`` of the cluster (``file:///`` when local).
    working_dir : str
        The driver's working directory.

    Returns
    -------
    str
        ``path`` itself when it has a scheme. On a local default file system
        (``file:``), a local absolute path (relative ones are taken from
        ``working_dir``). Otherwise ``default_fs`` + ``path`` for an absolute
        path and ``default_fs/user/<user>/path`` for a relative one.
    """
    if _SCHEME.match(path):
        return path
    if default_fs.startswith("file:"):
        return os.path.normpath(os.path.join(working_dir, path))
    base = default_fs.rstrip("/")
    if path.startswith("/"):
        return base + path
    return f"{base}/user/{getpass.getuser()}/{path}"


@dataclass(frozen=True)
class RunContext:
    """What ``main_fun(args, ctx)`` learns about its task.

    Attributes
    ----------
    job_name : str
        ``"chief"`` or ``"worker"``: the task's type in ``TF_CONFIG``.
    task_index : int
        The task's index within its job.
    worker_num : int
        The task's rank, 0 .. number of tasks - 1 (TensorFlowOnSpark's name).
    num_workers : int
        Number of training tasks (chief and workers).
    cluster_spec : dict
        ``{job_name: ["host:port", ...]}``, as in ``TF_CONFIG["cluster"]``.
    executor_id : int
        Same as ``worker_num``, as in TensorFlowOnSpark.
    default_fs : str
        Hadoop's ``fs.defaultFS`` (``file:///`` on a local file system).
    working_dir : str
        The driver's working directory when ``sparktf.run`` was called.
    tf_config : dict
        The ``TF_CONFIG`` dict, also in the ``TF_CONFIG`` environment variable.
    log_dir : str or None
        Where TensorBoard summaries go (``log_dir`` or ``tensorboard`` of
        ``sparktf.run``), already made absolute; None when neither was given.
    gpus : list of str
        Spark ``gpu`` resource addresses of the task; empty without GPU
        scheduling. The child's ``CUDA_VISIBLE_DEVICES`` holds them, indexed
        into the executor's own ``CUDA_VISIBLE_DEVICES`` when it has one.
    """

    job_name: str
    task_index: int
    worker_num: int
    num_workers: int
    cluster_spec: Dict[str, List[str]]
    executor_id: int
    default_fs: str
    working_dir: str
    tf_config: Dict[str, Any]
    log_dir: Optional[str] = None
    gpus: List[str] = field(default_factory=list)

    def absolute_path(self, path: str) -> str:
        """``path`` made absolute against ``default_fs`` and ``working_dir`` (see ``absolute_path``)."""
        return absolute_path(path, self.default_fs, self.working_dir)

    @property
    def role(self) -> str:
        """``"worker 1"``, ``"chief 0"``: how logs and errors name the task."""
        return f"{self.job_name} {self.task_index}"
