"""Stage-level resource requests: the ``resource_profile`` of training, evaluation and prediction.

A ``resource_profile`` (a ``pyspark.resource.ResourceProfile``, or a small
dict such as ``{"cpus": 4, "gpus": 1}`` for what each task takes) applies to
sparktf's own stages only, so ETL stages keep the session's defaults. Spark
runs such profiles on standalone (and ``local-cluster``), YARN and
Kubernetes: a profile of task resources only needs dynamic allocation off,
one with executor resources needs it on. Everything Spark would refuse is
refused here, before any job, with a :class:`~sparktf.errors.SparkTFError`.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

import pyspark
from pyspark.resource import ResourceProfile, ResourceProfileBuilder, TaskResourceRequests

from sparktf.errors import SparkTFError

#: The installed pyspark's major version (3 or 4): Spark 4's arguments are passed only under 4.
PYSPARK_MAJOR = int(pyspark.__version__.split(".")[0])

__all__ = ["ResourceProfileLike", "stage_profile", "describe_profile", "with_profile"]

ResourceProfileLike = Union[ResourceProfile, Mapping[str, float], None]
_TASK_KEYS = {"cpus": "cpus", "gpus": "gpu"}


def _from_mapping(requests: Mapping[str, Any], parameter: str) -> ResourceProfile:
    unknown = sorted(set(requests) - set(_TASK_KEYS))
    if unknown or not requests:
        raise SparkTFError(
            f"{parameter} as a dict takes the keys {sorted(_TASK_KEYS)} (what each task needs), got "
            f"{dict(requests)!r}; build a pyspark.resource.ResourceProfile for executor requests"
        )
    task = TaskResourceRequests()
    for key, value in requests.items():
        if not (isinstance(value, (int, float)) and value > 0) or (key == "cpus" and int(value) != value):
            raise SparkTFError(f"{parameter}[{key!r}] must be a positive {'integer' if key == 'cpus' else 'number'}, "
                               f"got {value!r}")
        if key == "cpus":
            task.cpus(int(value))
        else:
            task.resource(_TASK_KEYS[key], float(value))
    return ResourceProfileBuilder().require(task).build


def describe_profile(profile: ResourceProfile) -> str:
    """``"resource profile 3 (task: 1 cpus, 1 gpu)"``, for messages."""
    parts = [f"{request.amount:g} {name}" for name, request in sorted(profile.taskResources.items())]
    executor = [f"{request.amount:g} {name}" for name, request in sorted(profile.executorResources.items())]
    text = f"task: {', '.join(parts) or 'defaults'}"
    text += f"; executor: {', '.join(executor)}" if executor else ""
    return f"resource profile {profile.id} ({text})"


def stage_profile(
    kind: Any, resource_profile: ResourceProfileLike, parameter: str = "resource_profile"
) -> Optional[ResourceProfile]:
    """The profile sparktf's stages run with, checked and registered with Spark; None for the defaults.

    Parameters
    ----------
    kind : SessionKind
        The session that runs the stages.
    resource_profile : ResourceProfile, dict or None
        A ``ResourceProfile``, or ``{"cpus": n, "gpus": x}`` (either key may
        be left out) for each task's needs.
    parameter : str
        The argument's name, for messages.

    Raises
    ------
    SparkTFError
        Not a profile, a bad dict, plain ``local`` mode, or a profile Spark
        refuses on this cluster (e.g. a task-only profile with dynamic
        allocation on), naming Spark's reason.
    """
    if resource_profile is None:
        return None
    if isinstance(resource_profile, Mapping):
        resource_profile = _from_mapping(resource_profile, parameter)
    if not isinstance(resource_profile, ResourceProfile):
        raise SparkTFError(f"{parameter} must be a pyspark.resource.ResourceProfile or a dict such as "
                           f"{{'cpus': 4, 'gpus': 1}}, got {type(resource_profile).__name__}")
    master = kind.master
    if master.startswith("local") and not master.startswith("local-cluster"):
        raise SparkTFError(
            f"{parameter}: Spark does not run stage-level resource profiles in local mode "
            f"(master {master!r}); use a cluster (standalone, local-cluster, YARN, Kubernetes), "
            "or drop it and set spark.task.cpus / spark.task.resource.gpu.amount for the whole application"
        )
    try:
        return kind.register_profile(resource_profile)
    except Exception as error:  # py4j's error carries Spark's reason
        reason = str(getattr(error, "java_exception", error)).splitlines()[0]
        raise SparkTFError(
            f"{parameter}: Spark refused the resource profile: {reason}. A profile of task resources only "
            "needs spark.dynamicAllocation.enabled=false; one with executor resources needs it true"
        ) from None


def map_in_arrow(frame: Any, function: Any, schema: Any, barrier: bool = False,
                 profile: Optional[ResourceProfile] = None) -> Any:
    """``frame.mapInArrow(function, schema, barrier=barrier, profile=profile)``, ``profile`` passed only when set.

    Spark 3.5's ``mapInArrow`` has no ``profile`` argument: there a profile
    on a DataFrame stage is an error naming Spark 4.

    Raises
    ------
    SparkTFError
        A ``profile`` with pyspark older than 4.0.
    """
    if profile is None:
        return frame.mapInArrow(function, schema, barrier=barrier)
    if PYSPARK_MAJOR < 4:
        raise SparkTFError(
            f"resource_profile on a DataFrame stage (predict_dataframe, KerasModel.transform, Spark Connect jobs) "
            f"needs Spark 4 (pyspark >= 4.0; this is pyspark {pyspark.__version__}); drop it here, or set "
            "spark.task.cpus / spark.task.resource.gpu.amount for the whole application"
        )
    return frame.mapInArrow(function, schema, barrier=barrier, profile=profile)


def with_profile(rdd: Any, profile: Optional[ResourceProfile]) -> Any:
    """``rdd`` (a fresh RDD of sparktf's own stage) computed with ``profile``; unchanged for None."""
    return rdd if profile is None else rdd.withResources(profile)
