"""Spark plumbing that does not depend on a model or a dataset.

Owns running Spark jobs with sparktf's errors (``jobs``, ``remote_errors``,
``raising_rdd``), task slots, TensorFlow threads per task and the
rendezvous setting (``cluster``), the garbage-collector freeze of PySpark's workers
(``worker_gc``), and pickling the user's own code by value (``user_code``).

May import: ``sparktf.errors`` only.
"""
