"""Spark plumbing that does not depend on a model or a dataset.

Owns running Spark jobs with sparktf's errors (``jobs``, ``remote_errors``,
``raising_rdd``), task slots, TensorFlow threads per task and the
rendezvous setting (``cluster``), the garbage-collector freeze of PySpark's workers
(``worker_gc``), a worker daemon that loads TensorFlow before it forks
(``tf_daemon``), pickling the user's own code by value (``user_code``), and the
kind of session, classic or Spark Connect (``sessions``: one ``SessionKind`` that
the layers above ask for settings, task slots, plain tagged jobs and files on
the executors).

May import: layer 0 (``sparktf.errors``, ``sparktf.tf_startup``).
"""
