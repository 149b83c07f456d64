"""Spark ML Pipeline stages: ``KerasEstimator`` trains a Keras model on a DataFrame, ``KerasModel`` scores one.

Both are ``pyspark.ml`` stages: they go into a ``Pipeline`` (after
``VectorAssembler``, ``StringIndexer``, ...), under ``CrossValidator`` with a
``ParamGridBuilder`` over their Params, and save and load with the pipeline
(the Keras model as a ``.keras`` file beside the stage's JSON metadata).
Training is :class:`~sparktf.optimizer.TFOptimizer`'s synchronous data-parallel
SGD on barrier tasks; scoring is :class:`~sparktf.predictor.TFPredictor`'s
Arrow path, the model loaded once per Python worker.
"""

from sparktf.ml.estimator import KerasEstimator
from sparktf.ml.model import KerasModel

__all__ = ["KerasEstimator", "KerasModel"]
