"""The ``pyspark.ml`` Params of ``KerasEstimator`` and ``KerasModel``, with their getters.

Declared once here, as class attributes the way ``pyspark.ml.param.shared``
does, so ``est.epochs`` is a ``Param`` that ``ParamGridBuilder`` and
``CrossValidator`` take. ``model`` and ``callbacks`` hold Python objects:
they are never part of the JSON metadata (the model travels as a ``.keras``
file; callbacks are not saved).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional

from pyspark.ml.param import Param, Params, TypeConverters

__all__ = ["ColumnParams", "EstimatorParams", "ModelParams", "OBJECT_PARAMS", "TASKS", "init_params"]

#: Params whose values are Python objects, kept out of the saved metadata.
OBJECT_PARAMS = ("model", "callbacks")

#: What ``KerasModel.transform`` makes of the model's output.
TASKS = ("classification", "regression")


def _identity(value: Any) -> Any:
    return value


def _optional_string(value: Any) -> Optional[str]:
    return None if value is None else TypeConverters.toString(value)


def _optional_positive_int(value: Any) -> Optional[int]:
    return None if value is None else TypeConverters.toInt(value)


def init_params(instance: Params, init: Callable[..., None], arguments: Dict[str, Any]) -> None:
    """Give ``instance`` the defaults of ``init``'s signature and set the ``arguments`` the caller changed.

    ``arguments`` is ``init``'s ``locals()``; an argument left at its default
    stays a default (``isSet`` is False), as with ``pyspark.ml``'s own stages.
    """
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(init).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    instance._setDefault(**defaults)
    instance._set(**{name: arguments[name] for name, default in defaults.items() if arguments[name] is not default})


class ColumnParams(Params):
    """The columns both stages read and write."""

    featuresCol = Param(
        Params._dummy(), "featuresCol",
        "the features: a Vector or array column (or a numeric one for a scalar input)",
        typeConverter=TypeConverters.toString,
    )
    featureCols = Param(
        Params._dummy(), "featureCols",
        "one column per input of a multi-input model (overrides featuresCol)",
        typeConverter=TypeConverters.toListString,
    )
    predictionCol = Param(
        Params._dummy(), "predictionCol",
        "the prediction: the class index (double) for a classifier, else the model's output",
        typeConverter=TypeConverters.toString,
    )
    probabilityCol = Param(
        Params._dummy(), "probabilityCol",
        "a classifier's class probabilities as an ml Vector",
        typeConverter=TypeConverters.toString,
    )

    def getFeaturesCol(self) -> str:
        return self.getOrDefault(self.featuresCol)

    def setFeaturesCol(self, value: Any) -> Any:
        return self._set(featuresCol=value)

    def getFeatureCols(self) -> Optional[List[str]]:
        return self.getOrDefault(self.featureCols)

    def setFeatureCols(self, value: Any) -> Any:
        return self._set(featureCols=value)

    def getPredictionCol(self) -> str:
        return self.getOrDefault(self.predictionCol)

    def setPredictionCol(self, value: Any) -> Any:
        return self._set(predictionCol=value)

    def getProbabilityCol(self) -> str:
        return self.getOrDefault(self.probabilityCol)

    def setProbabilityCol(self, value: Any) -> Any:
        return self._set(probabilityCol=value)

    def feature_columns(self) -> List[str]:
        """The columns fed to the model, one per input: ``featureCols``, else ``[featuresCol]``."""
        columns = self.getFeatureCols()
        return list(columns) if columns else [self.getFeaturesCol()]

    def feature_columns_param(self) -> str:
        """The Param that named the feature columns, for error messages."""
        return "featureCols" if self.getFeatureCols() else "featuresCol"


class EstimatorParams(ColumnParams):
    """``KerasEstimator``'s training settings."""

    model = Param(Params._dummy(), "model", "the compiled Keras model to train a copy of", typeConverter=_identity)
    labelCol = Param(Params._dummy(), "labelCol", "the label column", typeConverter=TypeConverters.toString)
    weightCol = Param(
        Params._dummy(), "weightCol",
        "a numeric column of sample weights (>= 0); not set or empty: every row weighs 1.0",
        typeConverter=_optional_string,
    )
    batchSize = Param(
        Params._dummy(), "batchSize", "the global training batch (records per iteration over all workers)",
        typeConverter=TypeConverters.toInt,
    )
    epochs = Param(Params._dummy(), "epochs", "passes over the training data", typeConverter=TypeConverters.toInt)
    learningRate = Param(
        Params._dummy(), "learningRate", "replaces the compiled optimizer's learning rate when set",
        typeConverter=TypeConverters.toFloat,
    )
    numWorkers = Param(
        Params._dummy(), "numWorkers", "training tasks (default: the SparkContext's default parallelism)",
        typeConverter=_optional_positive_int,
    )
    trialParallelism = Param(
        Params._dummy(), "trialParallelism",
        "how many of fitMultiple's models train at once (a validator's parallelism): with numWorkers unset, "
        "each trains on the task slots // trialParallelism workers",
        typeConverter=TypeConverters.toInt,
    )
    validationFraction = Param(
        Params._dummy(), "validationFraction",
        "the share of rows held out for validation after every epoch (val_* in history); 0: none",
        typeConverter=TypeConverters.toFloat,
    )
    callbacks = Param(
        Params._dummy(), "callbacks", "keras.callbacks.Callback objects run on the driver (not saved)",
        typeConverter=_identity,
    )
    verbose = Param(
        Params._dummy(), "verbose", "0 silent, 1 a progress bar per epoch, 2 one line per epoch",
        typeConverter=TypeConverters.toInt,
    )
    seed = Param(
        Params._dummy(), "seed", "the seed of the validation split and of the shuffling",
        typeConverter=TypeConverters.toInt,
    )
    shardedTables = Param(
        Params._dummy(), "shardedTables",
        "the Embedding tables sharded across the workers: 'auto', a list of layer names, None (none), or "
        "'session' (the session's spark.sparktf.shardTables and shardTableBytes)",
        typeConverter=_identity,
    )

    def getModel(self) -> Any:
        return self.getOrDefault(self.model)

    def setModel(self, value: Any) -> Any:
        return self._set(model=value)

    def getLabelCol(self) -> str:
        return self.getOrDefault(self.labelCol)

    def setLabelCol(self, value: Any) -> Any:
        return self._set(labelCol=value)

    def getWeightCol(self) -> Optional[str]:
        return self.getOrDefault(self.weightCol) or None

    def setWeightCol(self, value: Any) -> Any:
        return self._set(weightCol=value)

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)

    def setBatchSize(self, value: Any) -> Any:
        return self._set(batchSize=value)

    def getEpochs(self) -> int:
        return self.getOrDefault(self.epochs)

    def setEpochs(self, value: Any) -> Any:
        return self._set(epochs=value)

    def getLearningRate(self) -> Optional[float]:
        return self.getOrDefault(self.learningRate)

    def setLearningRate(self, value: Any) -> Any:
        return self._set(learningRate=value)

    def getNumWorkers(self) -> Optional[int]:
        return self.getOrDefault(self.numWorkers)

    def setNumWorkers(self, value: Any) -> Any:
        return self._set(numWorkers=value)

    def getTrialParallelism(self) -> int:
        return self.getOrDefault(self.trialParallelism)

    def setTrialParallelism(self, value: Any) -> Any:
        return self._set(trialParallelism=value)

    def getValidationFraction(self) -> float:
        return self.getOrDefault(self.validationFraction)

    def setValidationFraction(self, value: Any) -> Any:
        return self._set(validationFraction=value)

    def getCallbacks(self) -> List[Any]:
        return list(self.getOrDefault(self.callbacks) or [])

    def setCallbacks(self, value: Any) -> Any:
        return self._set(callbacks=value)

    def getVerbose(self) -> int:
        return self.getOrDefault(self.verbose)

    def setVerbose(self, value: Any) -> Any:
        return self._set(verbose=value)

    def getSeed(self) -> int:
        return self.getOrDefault(self.seed)

    def setSeed(self, value: Any) -> Any:
        return self._set(seed=value)

    def getShardedTables(self) -> Any:
        return self.getOrDefault(self.shardedTables)

    def setShardedTables(self, value: Any) -> Any:
        return self._set(shardedTables=value)


class ModelParams(ColumnParams):
    """How ``KerasModel.transform`` runs the model and reads its output."""

    batchSize = Param(
        Params._dummy(), "batchSize", "records per model call in transform", typeConverter=TypeConverters.toInt
    )
    task = Param(
        Params._dummy(), "task",
        "'classification': the output is class probabilities (softmax, or one sigmoid unit) and the "
        "prediction is the class index; 'regression': the prediction is the output as it is",
        typeConverter=TypeConverters.toString,
    )
    fromLogits = Param(
        Params._dummy(), "fromLogits",
        "a classifier's output is logits: softmax / sigmoid is applied for the probabilities",
        typeConverter=TypeConverters.toBoolean,
    )

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)

    def setBatchSize(self, value: Any) -> Any:
        return self._set(batchSize=value)

    def getTask(self) -> str:
        return self.getOrDefault(self.task)

    def setTask(self, value: Any) -> Any:
        return self._set(task=value)

    def getFromLogits(self) -> bool:
        return self.getOrDefault(self.fromLogits)

    def setFromLogits(self, value: Any) -> Any:
        return self._set(fromLogits=value)
