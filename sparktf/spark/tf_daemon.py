"""A PySpark worker daemon that loads TensorFlow and Keras once, before it forks Python workers.

PySpark starts each executor's Python workers by forking them from a daemon
process. The stock daemon holds no TensorFlow, so every new worker imports
it, 2-4 s of CPU each: on the first task, and again whenever a worker
is replaced (after a failed or cancelled task, or one idle for a minute).
This daemon imports TensorFlow and Keras once, without their start-up log
lines, freezes what the imports allocated out of the garbage collector's
reach (so forked workers share those pages instead of copying them), and
then runs PySpark's own daemon loop unchanged. Its workers start with
TensorFlow loaded and without a runtime: no devices listed, no threads of
TensorFlow's own started, so each task still binds its devices and threads.

Use it where sparktf is installed on the executors (the daemon starts before
any file a session ships), with the session setting::

    spark.python.daemon.module=sparktf.spark.tf_daemon
"""

from __future__ import annotations

__all__ = ["preload", "main"]


def preload() -> None:
    """Import TensorFlow and Keras (quietly) and freeze the objects they made into the permanent generation.

    The freeze is a full collection of :mod:`sparktf.spark.worker_gc`'s, so the
    workers forked from here inherit its sizes: their first model load only
    freezes the model's objects instead of collecting everything again.
    """
    from sparktf import tf_startup
    from sparktf.spark.worker_gc import freeze_alive

    tf_startup.import_without_devices()
    freeze_alive()


def main() -> None:
    """Preload, then serve Python workers as ``pyspark.daemon`` does."""
    preload()
    from pyspark import daemon

    daemon.manager()


if __name__ == "__main__":
    main()
