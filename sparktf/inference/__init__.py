"""Batch inference on executors: feeding models, running them, shaping their outputs.

Owns the executor-side half of :class:`sparktf.predictor.TFPredictor`: model
input plans (``feeds``), cached model runners (``runners``) and the Arrow
output of ``predict_dataframe`` (``dataframe_output``).

May import: ``sparktf.errors``, ``sparktf.data``, ``sparktf.models``,
``sparktf.spark``. Never the public modules (``sparktf.predictor``, ...).
"""
