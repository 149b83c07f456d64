"""The ``sparktf`` loggers of a Python worker: their INFO lines in the executor's log without any set-up.

A Python worker starts with Python's logging unconfigured, so the INFO lines
sparktf's worker-side code logs (generation's per-window figures, say) would
go nowhere: only WARNING and above reach stderr, through logging's last
resort. sparktf configures nothing on the driver either, where the user's own
set-up (``logging.basicConfig``, a notebook's) decides. On a worker no user
code runs before sparktf's, so :func:`configure_worker_logging`, which every
sparktf task that runs TensorFlow calls first
(:func:`~sparktf.spark.task_devices.prepare_tensorflow_task`), gives the
``sparktf`` logger a handler writing to the worker's stderr (the executor's
log: PySpark copies a worker's stderr there) and the level INFO, once per
process. Where the worker's logging was set up already (a handler on the
root or the ``sparktf`` logger, or a level set on ``sparktf``), it is left
as it is.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["configure_worker_logging", "LOG_FORMAT"]

#: How a sparktf line reads in the executor's log.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_worker_logging() -> None:
    """Send this Python worker's ``sparktf`` log lines of INFO and above to its stderr (see the module docstring).

    Nothing happens outside a Spark task, nor where logging was set up already, so calling it again is free.
    """
    from pyspark import TaskContext

    logger = logging.getLogger("sparktf")
    if TaskContext.get() is None or logger.handlers or logging.getLogger().handlers or logger.level != logging.NOTSET:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
