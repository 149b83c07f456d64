"""``KerasEstimator``: distributed Keras training as a ``pyspark.ml`` Estimator."""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from pyspark.ml import Estimator
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sparktf.data.sources import check_weight_column
from sparktf.dataset import TFDataset
from sparktf.errors import DataError
from sparktf.inference.feeds import keras_inputs
from sparktf.inference.columns import feature_leaves
from sparktf.ml.columns import check_label_column, model_output
from sparktf.ml.model import KerasModel, load_keras_file
from sparktf.ml.outputs import CLASSIFICATION, loss_name, task_of
from sparktf.ml.params import EstimatorParams, init_params
from sparktf.ml.persistence import SavedStage
from sparktf.models.payload import ModelPayload
from sparktf.optimizer import TFOptimizer
from sparktf.spark.calls import labelled, task_slot_total
from sparktf.spark.interrupts import install_interrupt_handler
from sparktf.triggers import MaxEpoch

__all__ = ["KerasEstimator"]

_LOG = logging.getLogger(__name__)
_KERAS_FILE = "model.keras"
_CLASS_INDEX_LOSSES = ("sparse_categorical_crossentropy",)
_BINARY_LOSSES = ("binary_crossentropy", "binary_focal_crossentropy")


class KerasEstimator(Estimator, EstimatorParams, SavedStage):
    """Trains a copy of a compiled Keras model on a DataFrame with :class:`~sparktf.optimizer.TFOptimizer`.

    A ``pyspark.ml`` Estimator: it goes into a ``Pipeline``, its Params
    (``est.epochs``, ``est.learningRate``, ...) into a ``ParamGridBuilder``
    and ``CrossValidator``, and it saves and loads with ``write()`` / ``load``.

    Parameters
    ----------
    model : keras.Model
        A compiled model; ``fit`` trains a copy and never changes it.
    featuresCol : str
        A Vector or array column (a number for a scalar input).
    labelCol : str
        Class indices (e.g. from ``StringIndexer``) for a model compiled with
        a sparse or binary cross-entropy; otherwise numbers, Vectors or arrays
        of the output's shape.
    weightCol : str, optional
        A numeric column of sample weights (numbers >= 0), as ``fit``'s
        ``sample_weight``: it weights each row's loss and weighted metrics
        in training and validation; not set (or empty): every row weighs 1.0.
    predictionCol, probabilityCol : str
        The columns the fitted :class:`~sparktf.ml.model.KerasModel` adds.
    featureCols : list of str, optional
        One column per input of a multi-input model, instead of ``featuresCol``.
    batchSize : int
        The global training batch (records per iteration over all workers).
    epochs : int
        Passes over the training rows.
    learningRate : float, optional
        Replaces the compiled optimizer's learning rate.
    numWorkers : int, optional
        Training tasks (default: ``sc.defaultParallelism``, or the task
        slots // ``trialParallelism`` when that is over 1).
    trialParallelism : int
        How many models train at once: set it to the ``parallelism`` of the
        ``CrossValidator`` or ``TrainValidationSplit`` (or of any validator)
        that fits this estimator, alone or inside a ``Pipeline``. With
        ``numWorkers`` unset each model then trains on the cluster's task
        slots // ``trialParallelism`` workers (at least 1), so that that many
        fit at once. Default 1: each model takes every slot.
    validationFraction : float
        The share of rows held out and evaluated after every epoch
        (``val_*`` in the model's ``history``); 0 for none.
    callbacks : list of keras.callbacks.Callback, optional
        Run on the driver as in ``TFOptimizer.optimize`` (not saved).
    verbose : int
        0 silent, 1 a progress bar per epoch, 2 one line per epoch.
    seed : int
        Seeds the validation split and the shuffling.
    shardedTables : "session", "auto", list of str or None
        As ``TFOptimizer``'s ``sharded_tables`` (default ``"session"``: the
        session's settings decide).
    """

    def __init__(
        self,
        model: Any = None,
        *,
        featuresCol: str = "features",
        labelCol: str = "label",
        weightCol: Optional[str] = None,
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        featureCols: Optional[List[str]] = None,
        batchSize: int = 32,
        epochs: int = 1,
        learningRate: Optional[float] = None,
        numWorkers: Optional[int] = None,
        trialParallelism: int = 1,
        validationFraction: float = 0.0,
        callbacks: Optional[List[Any]] = None,
        verbose: int = 0,
        seed: int = 0,
        shardedTables: Any = "session",
    ):
        super().__init__()
        init_params(self, KerasEstimator.__init__, locals())

    def setParams(self, **params: Any) -> "KerasEstimator":
        """Set any of the constructor's Params by name."""
        return self._set(**params)

    # ------------------------------------------------------------------ fit

    def _fit(self, dataset: DataFrame) -> KerasModel:
        model = self._compiled_model()
        self._check_settings()
        columns = self.feature_columns()
        declared = keras_inputs(model)
        feature_leaves(dataset, columns, None if declared is None else declared[0], self.feature_columns_param())
        task, from_logits = task_of(model)
        loss = loss_name(model.loss)
        check_label_column(dataset, self.getLabelCol(), model_output(model), loss, task == CLASSIFICATION)
        if self.getWeightCol():
            check_weight_column(dataset, self.getWeightCol(), "weightCol")
        trained, history = self._train(model, dataset, columns, loss)  # concurrent fits: optimize plans the slots
        fitted = KerasModel.from_keras(
            trained, task=task, fromLogits=from_logits, featuresCol=self.getFeaturesCol(),
            featureCols=self.getFeatureCols(), predictionCol=self.getPredictionCol(),
            probabilityCol=self.getProbabilityCol(),
        )
        fitted._history = history
        return fitted

    def fitMultiple(self, dataset: DataFrame, paramMaps: Sequence[Dict[Any, Any]]) -> Iterator[Tuple[int, KerasModel]]:
        """Fit one model per param map; every ``next()`` trains the next one in the calling thread.

        ``CrossValidator`` and ``TrainValidationSplit`` with ``parallelism=k``
        call ``next()`` from ``k`` threads, so up to ``k`` models train at once,
        each as soon as its task slots are free (trials that do not fit wait
        their turn, in order). With ``numWorkers`` unset (in the estimator
        and the param map) each model trains on ``task slots //
        trialParallelism`` workers (at least 1): set ``trialParallelism=k``
        for ``k`` at once.
        """
        install_interrupt_handler()  # called from the validator's thread: Ctrl-C then cancels every trial
        param_maps = list(paramMaps)
        workers = self._trial_workers(dataset)
        if workers is not None:
            _LOG.info("KerasEstimator.fitMultiple: %d models, %d at a time, each on %d workers (numWorkers unset)",
                      len(param_maps), self.getTrialParallelism(), workers)
        return _ConcurrentFits(self, dataset, param_maps)

    def _trial_workers(self, dataset: DataFrame) -> Optional[int]:
        """With ``numWorkers`` unset and ``trialParallelism`` k > 1, each model's workers: the cluster's task slots
        // k (at least 1), the same for every model however many others hold slots; else None (numWorkers)."""
        if self.getNumWorkers() is not None or self.getTrialParallelism() <= 1:
            return None
        return max(1, task_slot_total(dataset.sparkSession) // self.getTrialParallelism())

    def _compiled_model(self) -> Any:
        import keras

        model = self.getModel()
        if not isinstance(model, keras.Model):
            raise DataError(f"KerasEstimator needs a compiled keras.Model as model=..., got {model!r}")
        if not getattr(model, "compiled", False):
            raise DataError(
                f"the Keras model {model.name!r} is not compiled: call model.compile(optimizer=..., "
                "loss=...) before KerasEstimator.fit"
            )
        return model

    def _check_settings(self) -> None:
        checks = {
            "epochs": self.getEpochs() >= 1,
            "batchSize": self.getBatchSize() >= 1,
            "validationFraction": 0.0 <= self.getValidationFraction() < 1.0,
            "learningRate": self.getLearningRate() is None or self.getLearningRate() > 0,
            "numWorkers": self.getNumWorkers() is None or self.getNumWorkers() >= 1,
            "trialParallelism": self.getOrDefault(self.trialParallelism) >= 1,
            "verbose": self.getVerbose() in (0, 1, 2),
        }
        for name, fine in checks.items():
            if not fine:
                raise DataError(
                    f"{name}={self.getOrDefault(name)!r} is out of range: epochs, batchSize, numWorkers and "
                    "trialParallelism are >= 1, 0 <= validationFraction < 1, learningRate > 0, verbose is 0, 1 or 2"
                )

    def _train(self, model: Any, df: DataFrame, columns: List[str], loss: Optional[str]) -> Tuple[Any, Dict]:
        """Train a copy of ``model``; return it and its per-epoch logs."""
        copy = ModelPayload.from_model(model).build()
        label, weight = self.getLabelCol(), self.getWeightCol()
        data = df.select(*columns, _label_column(label, loss), *([weight] if weight else []))
        validation = None
        fraction = self.getValidationFraction()
        if fraction > 0:
            data, validation = data.randomSplit([1.0 - fraction, fraction], seed=self.getSeed())
        dataset = TFDataset.from_dataframe(
            data, columns, label, batch_size=self.getBatchSize(), validation_df=validation, seed=self.getSeed(),
            weight_col=weight,
        )
        optimizer = TFOptimizer.from_keras(
            copy, dataset, optimizer=_with_learning_rate(copy.optimizer, self.getLearningRate()),
            num_workers=self.getNumWorkers() or self._trial_workers(df), sharded_tables=self.getShardedTables(),
        )
        result = optimizer.optimize(MaxEpoch(self.getEpochs()), callbacks=self.getCallbacks(),
                                    verbose=self.getVerbose())
        return copy, epoch_logs(result, dataset.iterations_per_epoch(optimizer.num_workers))

    # ------------------------------------------------------------------ persistence

    def stage_metadata(self) -> Dict[str, Any]:
        return {}

    def write_model_files(self, directory: str) -> Optional[str]:
        model = self.getModel()
        if model is None:
            return None
        model.save(f"{directory}/{_KERAS_FILE}")
        return _KERAS_FILE

    def restore(self, metadata: Dict[str, Any], local_file: Optional[str]) -> None:
        if local_file is not None:
            self._set(model=load_keras_file(local_file))


def _label_column(label: str, loss: Optional[str]) -> Column:
    """The label as the loss takes it: class indices as int, binary targets as float."""
    if loss in _CLASS_INDEX_LOSSES:
        return F.col(label).cast("int").alias(label)
    if loss in _BINARY_LOSSES:
        return F.col(label).cast("float").alias(label)
    return F.col(label)


def _with_learning_rate(optimizer: Any, learning_rate: Optional[float]) -> Any:
    """A fresh optimizer like ``optimizer`` with ``learning_rate``, or None to keep the compiled one."""
    if learning_rate is None:
        return None
    return type(optimizer).from_config({**optimizer.get_config(), "learning_rate": float(learning_rate)})


def epoch_logs(result: Dict[str, Any], iterations_per_epoch: int) -> Dict[str, List[float]]:
    """Per-epoch logs from ``optimize``'s result: the mean training loss per epoch, the compiled metrics and
    the ``val_*`` values (both already one per epoch)."""
    losses = [float(loss) for loss in result["loss"]]
    logs = {"loss": [sum(chunk) / len(chunk) for chunk in _chunks(losses, iterations_per_epoch)]}
    logs.update({name: [float(v) for v in values] for name, values in result.items()
                 if name not in ("loss", "iterations", "epochs")})
    return logs


def _chunks(values: List[float], size: int) -> Iterator[List[float]]:
    for start in range(0, len(values), size):
        yield values[start:start + size]


class _ConcurrentFits:
    """``fitMultiple``'s thread-safe iterator: each ``next()`` takes the next param map and trains it in its thread."""

    def __init__(self, estimator: KerasEstimator, dataset: DataFrame, param_maps: List[Dict[Any, Any]]):
        self._estimator = estimator
        self._dataset = dataset
        self._param_maps = param_maps
        self._lock = threading.Lock()
        self._next = 0

    def __iter__(self) -> "_ConcurrentFits":
        return self

    def __next__(self) -> Tuple[int, KerasModel]:
        with self._lock:
            index = self._next
            if index >= len(self._param_maps):
                raise StopIteration
            self._next += 1
        with labelled(f"model {index + 1}/{len(self._param_maps)}"):
            return index, self._estimator.fit(self._dataset, self._param_maps[index])
