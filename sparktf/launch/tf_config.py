"""The role of each barrier task and its ``TF_CONFIG``; converting ``master`` to ``chief``."""

from __future__ import annotations

import copy
import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["task_roles", "build_tf_config", "master_to_chief"]


def task_roles(num_tasks: int, master_node: Optional[str] = None) -> List[Tuple[str, int]]:
    """``(job_name, task_index)`` of every barrier task, by rank.

    Parameters
    ----------
    num_tasks : int
        Number of barrier tasks.
    master_node : {None, "chief"}
        ``None``: every task is a ``worker`` whose index is its rank.
        ``"chief"``: rank 0 is ``chief`` 0, rank ``r`` > 0 is ``worker`` ``r - 1``.

    Returns
    -------
    list of (str, int)
    """
    if master_node is None:
        return [("worker", rank) for rank in range(num_tasks)]
    if master_node == "chief":
        return [("chief", 0)] + [("worker", rank - 1) for rank in range(1, num_tasks)]
    raise ValueError(f"master_node must be None or 'chief', got {master_node!r}")


def build_tf_config(addresses: Sequence[str], rank: int, master_node: Optional[str] = None) -> Dict[str, Any]:
    """The ``TF_CONFIG`` dict of the task of rank ``rank``.

    Parameters
    ----------
    addresses : sequence of str
        ``host:port`` of every task's server, by rank.
    rank : int
        The task's rank (its barrier partition id).
    master_node : {None, "chief"}
        See ``task_roles``.

    Returns
    -------
    dict
        ``{"cluster": {job: [addresses]}, "task": {"type": job, "index": i}}``.
    """
    roles = task_roles(len(addresses), master_node)
    cluster: Dict[str, List[str]] = {}
    for (job_name, _), address in zip(roles, addresses):
        cluster.setdefault(job_name, []).append(address)
    job_name, task_index = roles[rank]
    return {"cluster": cluster, "task": {"type": job_name, "index": task_index}}


def master_to_chief(tf_config: Union[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """Convert a ``TF_CONFIG`` that names a ``master`` task into one that names a ``chief``.

    TF 1.x estimators and some cluster managers write ``master``;
    ``MultiWorkerMirroredStrategy`` and ``ParameterServerStrategy`` want
    ``chief``. Every other job (``worker``, ``ps``, ``evaluator``) and key
    (``environment``, ``rpc_layer``) is kept as it is.

    Parameters
    ----------
    tf_config : str or mapping
        The ``TF_CONFIG`` as JSON text or as a dict.

    Returns
    -------
    dict
        A new dict; the argument is not changed. One without ``master`` is
        returned as a copy, unchanged.

    Raises
    ------
    ValueError
        The config names both ``master`` and ``chief``, or more than one
        ``master`` (a cluster has at most one chief).
    """
    config = json.loads(tf_config) if isinstance(tf_config, str) else copy.deepcopy(dict(tf_config))
    cluster = dict(config.get("cluster", {}))
    if "master" in cluster:
        if "chief" in cluster:
            raise ValueError("TF_CONFIG names both a 'master' and a 'chief' job; keep one of them")
        masters = list(cluster.pop("master"))
        if len(masters) != 1:
            raise ValueError(f"TF_CONFIG names {len(masters)} 'master' tasks; a cluster has exactly one chief")
        config["cluster"] = {"chief": masters, **cluster}
    task = config.get("task")
    if isinstance(task, Mapping) and task.get("type") == "master":
        config["task"] = {**task, "type": "chief"}
    return config
