"""Running existing ``tf.distribute`` programs on Spark: ``sparktf.run``.

This subpackage owns launching a user's ``main_fun(args, ctx)`` in one fresh
child Python process per Spark barrier task, with ``TF_CONFIG`` set for its
role, and everything around it: port reservation, the ``ctx`` object, child
output streamed to the driver, failures, timeouts and orphan-free cleanup.

Modules, one job each:

- ``ports``: reserving a TCP port for a task's TensorFlow server, race-free.
- ``tf_config``: the roles of the tasks, ``TF_CONFIG`` per task, ``master_to_chief``.
- ``context``: ``RunContext``, the ``ctx`` handed to ``main_fun``.
- ``logstream``: the driver's authenticated log server and the tasks' client.
- ``failures``: child failures as text that survives Spark's error path.
- ``program``: pickling ``main_fun`` and ``args`` (by value for non-installed modules).
- ``slots``: the task-slot check before the barrier job.
- ``child``: starting, streaming, bounding and killing the child process (task side).
- ``bootstrap``: the child process's entry point (``python -m sparktf.launch.bootstrap``).
- ``task``: the barrier task that runs on an executor.
- ``runner``: the driver side, ``run``.

It may import only ``sparktf.errors``, ``sparktf.context`` (for
``init_spark``), ``sparktf.spark`` (the session's kind), pyspark,
cloudpickle, the standard library and its own modules. TensorFlow is
imported by the user's program in the child, never here.
"""
