"""``KerasModel``: a fitted Keras model (or a SavedModel) as a ``pyspark.ml`` Model."""

from __future__ import annotations

import os
import shutil
import warnings
from typing import Any, Dict, List, Optional, Sequence

from pyspark.ml import Model
from pyspark.sql import DataFrame

from sparktf.errors import DataError
from sparktf.inference.feeds import SINGLE, TensorInfo
from sparktf.inference.columns import feature_leaves
from sparktf.ml.outputs import CLASSIFICATION, REGRESSION, task_of, with_prediction_columns
from sparktf.ml.params import TASKS, ModelParams, init_params
from sparktf.ml.persistence import SavedStage
from sparktf.models.rebuild import register_sparktf_classes
from sparktf.models.saved_model_archive import SavedModelArchive
from sparktf.inference.model_sources import KerasModelSource, ModelSource, SavedModelSource
from sparktf.predictor import check_new_column, column_leaves, dataframe_with_predictions
from sparktf.storage import kept_local_copy

__all__ = ["KerasModel"]

#: The hidden column holding the model's raw output inside ``transform``.
_RAW_OUTPUT = "__sparktf_raw_output"
_KERAS_FILE = "model.keras"
_SAVED_MODEL_DIR = "saved_model"


class KerasModel(Model, ModelParams, SavedStage):
    """A Keras model (or a SavedModel signature) that adds predictions to DataFrames.

    ``KerasEstimator.fit`` returns one; :meth:`from_keras` and
    :meth:`from_saved_model` wrap models trained elsewhere. ``transform``
    keeps every column and row of its input and adds ``predictionCol``
    (and ``probabilityCol`` for a classifier); it is lazy, batched through
    Arrow, and loads the model once per Python worker.

    Parameters
    ----------
    featuresCol : str
        The column fed to a single-input model: a Vector, an array, or a
        number for a scalar input.
    featureCols : list of str, optional
        One column per input of a multi-input model (matched by name when
        they are named like the inputs, else in order).
    predictionCol : str
        For a classifier the 0-based class index as a double; otherwise the
        model's output: a double for one value, ``array<float>`` for more.
    probabilityCol : str
        A classifier's class probabilities, an ``ml.linalg`` Vector.
    batchSize : int
        Records per model call.
    task : str
        ``"classification"`` (the output is softmax probabilities, or one
        sigmoid unit for two classes) or ``"regression"``.
    fromLogits : bool
        A classifier's output is logits; softmax (or sigmoid) gives the
        probabilities.
    """

    def __init__(
        self,
        *,
        featuresCol: str = "features",
        featureCols: Optional[List[str]] = None,
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        batchSize: int = 256,
        task: str = REGRESSION,
        fromLogits: bool = False,
    ):
        super().__init__()
        init_params(self, KerasModel.__init__, locals())
        self._keras: Any = None
        self._saved_model: Optional[Dict[str, Any]] = None
        self._history: Dict[str, List[float]] = {}
        self._model_source: Optional[ModelSource] = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_keras(
        cls, model: Any, *, task: Optional[str] = None, fromLogits: Optional[bool] = None, **params: Any
    ) -> "KerasModel":
        """Wrap a Keras model trained elsewhere.

        Parameters
        ----------
        model : keras.Model
            A built model. It is used as it is (not copied).
        task : str, optional
            Default: ``"classification"`` when the model is compiled with a
            (sparse / binary / categorical) cross-entropy, else ``"regression"``.
        fromLogits : bool, optional
            Default: the compiled loss's ``from_logits``.
        **params
            Any other Param of the class (``featuresCol``, ``batchSize``, ...).

        Returns
        -------
        KerasModel
        """
        compiled_task, compiled_logits = task_of(model)
        stage = cls(
            task=task or compiled_task, fromLogits=compiled_logits if fromLogits is None else fromLogits, **params
        )
        stage._keras = model
        return stage

    @classmethod
    def from_saved_model(
        cls,
        path: str,
        *,
        signature: str = "serving_default",
        output: Optional[str] = None,
        task: str = REGRESSION,
        fromLogits: bool = False,
        **params: Any,
    ) -> "KerasModel":
        """Wrap one signature of a SavedModel (``tf.saved_model.save`` / ``model.export``).

        Parameters
        ----------
        path : str
            The SavedModel directory: a local path or a URI (copied to the
            driver's local disk while the process lives).
        signature : str
            The signature to call.
        output : str, optional
            The output to use; None for every output (one output, or a
            struct column of them for ``task="regression"``).
        task, fromLogits
            What the output is (a SavedModel has no loss to tell).
        **params
            Any other Param of the class.

        Raises
        ------
        DataError
            For a missing signature or output name.
        """
        stage = cls(task=task, fromLogits=fromLogits, **params)
        stage._saved_model = {"path": kept_local_copy(path, "SavedModel"), "signature": signature, "output": output}
        stage._source()  # reads the SavedModel now: a wrong signature or output fails here
        return stage

    # ------------------------------------------------------------------ what it holds

    @property
    def keras_model(self) -> Any:
        """The Keras model (None for a model from :meth:`from_saved_model`)."""
        return self._keras

    @property
    def history(self) -> Dict[str, List[float]]:
        """Per-epoch logs of the fit that made this model: ``loss`` and ``val_*`` (empty if none)."""
        return dict(self._history)

    def _source(self) -> ModelSource:
        """The model broadcast for executors, made once per stage."""
        if self._model_source is None:
            if self._keras is not None:
                self._model_source = KerasModelSource(self._keras)
            elif self._saved_model is not None:
                saved = self._saved_model
                self._model_source = SavedModelSource(saved["path"], saved["signature"], saved["output"])
            else:
                raise DataError("this KerasModel holds no model: use KerasModel.from_keras / from_saved_model")
        return self._model_source

    # ------------------------------------------------------------------ transform

    def _transform(self, dataset: DataFrame) -> DataFrame:
        task = self.getTask()
        if task not in TASKS:
            raise DataError(f"task must be one of {list(TASKS)}, got {task!r}")
        prediction, probability = self.getPredictionCol(), self.getProbabilityCol()
        check_new_column(dataset, prediction, "predictionCol")
        if task == CLASSIFICATION:
            check_new_column(dataset, probability, "probabilityCol")
        columns = self.feature_columns()
        source = self._source()
        leaves = feature_leaves(dataset, columns, source.declared_inputs(), self.feature_columns_param())
        leaves = leaves or column_leaves(dataset, columns, source)  # inputs of any length: read from the data
        scored = dataframe_with_predictions(source, dataset, columns, leaves, _RAW_OUTPUT, self.getBatchSize())
        return with_prediction_columns(
            scored, _RAW_OUTPUT, dataset.columns, self._single_output(source, leaves, columns),
            task, self.getFromLogits(), prediction, probability,
        )

    @staticmethod
    def _single_output(source: ModelSource, leaves: Sequence[Any], columns: List[str]) -> Optional[TensorInfo]:
        kind, outputs = source.outputs(source.feed(leaves, columns))
        return outputs[0] if kind == SINGLE else None

    # ------------------------------------------------------------------ persistence

    def stage_metadata(self) -> Dict[str, Any]:
        saved = self._saved_model or {}
        return {"history": self._history, "signature": saved.get("signature"), "output": saved.get("output")}

    def write_model_files(self, directory: str) -> str:
        if self._keras is not None:
            self._keras.save(os.path.join(directory, _KERAS_FILE))
            return _KERAS_FILE
        self._source()  # refuses a stage without a model
        shutil.copytree(self._saved_model["path"], os.path.join(directory, _SAVED_MODEL_DIR))
        return _SAVED_MODEL_DIR

    def restore(self, metadata: Dict[str, Any], local_file: Optional[str]) -> None:
        self._history = dict(metadata.get("history") or {})
        if local_file is None:
            return
        if os.path.basename(local_file) == _SAVED_MODEL_DIR:
            path = SavedModelArchive.from_directory(local_file).extract()  # kept until the process exits
            self._saved_model = {"path": path, "signature": metadata["signature"], "output": metadata["output"]}
        else:
            self._keras = load_keras_file(local_file)


def load_keras_file(path: str) -> Any:
    """``keras.saving.load_model``, with a ``DataError`` saying how to make custom objects loadable."""
    import keras

    register_sparktf_classes()
    try:
        with warnings.catch_warnings():  # a model saved before its optimizer was built loads fine
            warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
            return keras.saving.load_model(path)
    except (TypeError, ValueError) as exc:
        raise DataError(
            f"cannot load the saved Keras model: {exc}. Custom layers, losses and metrics must be "
            "importable and decorated with keras.saving.register_keras_serializable(); a model with "
            "Lambda layers loads after keras.config.enable_unsafe_deserialization()"
        ) from exc
