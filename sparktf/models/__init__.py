"""Models and graphs as things that travel to executors and are loaded there once.

Owns Keras models as bytes (``payload``), the per-process model cache
(``cache``), SavedModel directories as tar bytes (``saved_model_archive``),
every TensorFlow graph form frozen into one (``graph_io``, ``frozen_graph``)
and the error for a batch a model rejects (``batch_errors``).

May import: ``sparktf.errors``, ``sparktf.spark``, ``sparktf.data``.
"""
