"""The models a ``TFPredictor`` (and a ``sparktf.ml.KerasModel``) runs, described on the driver.

A *model source* knows its model's inputs and outputs (:class:`TensorInfo`),
how a batch's leaves feed them, and the :class:`~sparktf.inference.runners.ModelHandle`
the executors load it from: a Keras model's payload bytes shared once
(:class:`KerasModelSource`), a SavedModel's tar (:class:`SavedModelSource`),
or the newest version published to a ``model_dir`` (:class:`PublishedModelSource`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from sparktf.context import current_session
from sparktf.data import specs
from sparktf.data.batch_maps import BatchMaps, MappedElements
from sparktf.errors import ConfigurationError, DataError
from sparktf.inference.feeds import DICT, LIST, SINGLE, Feed, TensorInfo, keras_feed, keras_inputs, plan_feed
from sparktf.inference.generation import GenerationOptions, generation_options
from sparktf.inference.runners import ModelHandle
from sparktf.models.payload import ModelPayload
from sparktf.models.published import load_version, newest_version
from sparktf.models.saved_model_archive import SavedModelArchive, load_saved_model
from sparktf.spark.session_kind import InlineBytes
from sparktf.storage import local_copy, store_for

__all__ = ["KerasModelSource", "PublishedModelSource", "SavedModelSource", "ModelSource"]

#: What to do instead of shipping a large model inside a Connect stream's plan.
_PUBLISH_INSTEAD = ("train or save it to a model_dir the executors can read and score the stream with "
                    "TFPredictor.from_published(model_dir, ...), whose tasks read it themselves")


class KerasModelSource:
    """A Keras model on the driver: its inputs, outputs and the handle of its bytes on the executors.

    ``method`` is ``"call"`` (``model(x, training=False)``, after the model's
    own preprocessing, as ``model.predict``) or ``"generate"`` (``model.generate``
    on prompts, with ``options`` as its keywords).
    """

    #: The output column of the number of the version that scored a row (published versions only).
    version_col: Optional[str] = None

    def __init__(self, model: Any, method: str = "call", options: Optional[Dict[str, Any]] = None):
        self.model, (self.method, generation) = model, _checked_method(model, method, options)
        payload = ModelPayload.from_model(model, include_optimizer=False)
        self.handle = ModelHandle("keras", payload.key, current_session().share(payload.to_bytes(), "model"),
                                  method=method, generation=generation)

    def inline_bytes(self) -> Any:
        """The model's bytes to travel inside a task's function (a Connect stream's, see
        ``predictor.dataframe_with_predictions``)."""
        payload = ModelPayload.from_model(self.model, include_optimizer=False).to_bytes()
        return InlineBytes.of(payload, "the model", _PUBLISH_INSTEAD)

    def elements(self, maps: BatchMaps, stored: tuple) -> MappedElements:
        """Batches of ``stored`` features as the model gets them: after ``maps`` and the model's preprocessing
        (``generate`` preprocesses prompts itself)."""
        return MappedElements.of_structure(maps, stored, self.model if self.method == "call" else None)

    def declared_inputs(self) -> Optional[List[TensorInfo]]:
        """The inputs the model declares (None: it declares none, or ``generate``'s prompts)."""
        declared = None if self.method == "generate" else keras_inputs(self.model)
        return None if declared is None else declared[0]

    def feed(self, leaves: Sequence[specs.LeafSpec], names: Optional[Sequence[str]]) -> Feed:
        if self.method == "generate":
            return plan_feed([TensorInfo("prompt", np.dtype(object), ())], SINGLE, leaves, names)
        return keras_feed(self.model, leaves, names)

    def outputs(self, feed: Feed) -> Tuple[str, List[TensorInfo]]:
        import keras

        if self.method == "generate":
            return SINGLE, [TensorInfo("completion", np.dtype(str), ())]

        symbolic = [keras.KerasTensor((None,) + info.shape, dtype=specs.dtype_name(info.dtype)) for info in feed.inputs]
        spec = self.model.compute_output_spec(feed.structured(symbolic))
        if isinstance(spec, dict):
            return DICT, [TensorInfo.from_tensor(name, t) for name, t in spec.items()]
        if isinstance(spec, (list, tuple)):
            return LIST, [TensorInfo.from_tensor(f"output_{i}", t) for i, t in enumerate(spec)]
        return SINGLE, [TensorInfo.from_tensor("output", spec)]


class PublishedModelSource(KerasModelSource):
    """The newest published version of a ``model_dir`` (``optimize_stream``'s): each task loads the newest version
    when it starts, so a running streaming query picks up new ones. The driver reads the newest one now for the
    inputs and outputs, which every later version must keep. With ``version_col``, each output row carries the
    number of the version that scored it."""

    def __init__(self, model_dir: str, method: str = "call", options: Optional[Dict[str, Any]] = None,
                 version_col: Optional[str] = None):
        version = newest_version(model_dir)
        if version is None:
            raise DataError(f"no version is published in {model_dir!r} (no {model_dir}/published/<n>/manifest.json): "
                            "run TFOptimizer.optimize_stream with publish_every=... first")
        model = load_version(version)
        self.model, (self.method, generation) = model, _checked_method(model, method, options)
        store = store_for(model_dir, "model_dir")
        self.handle = ModelHandle("published", store.executor_uri(model_dir), None, method=method,
                                  generation=generation, io_signature=version.manifest.get("signature"))
        self.version_col = version_col

    def inline_bytes(self) -> Any:
        """Nothing: the tasks read the versions from ``model_dir``."""
        return None


def _checked_method(model: Any, method: str, options: Optional[Dict[str, Any]]
                    ) -> Tuple[str, Optional[GenerationOptions]]:
    """``method`` when ``model`` can run it with ``options``, and ``generate``'s options checked (None for
    ``"call"``); a ``DataError`` saying what fits otherwise (see also ``generation_options``)."""
    if method not in ("call", "generate"):
        raise DataError(f"method must be 'call' or 'generate', got {method!r}")
    if method == "generate" and not callable(getattr(model, "generate", None)):
        raise DataError(f"method='generate' needs a model with a generate() method (a Keras Hub CausalLM); "
                        f"{type(model).__name__} has none")
    if options and method != "generate":
        raise ConfigurationError(f"keywords {sorted(options)} go to the model's method; model(x) takes none. "
                                 "Pass method='generate' to generate text")
    return method, generation_options(model, options or {}) if method == "generate" else None


class SavedModelSource:
    """A SavedModel signature on the driver: its inputs, chosen outputs and the handle of its bytes on the executors."""

    version_col: Optional[str] = None  # as KerasModelSource's: none

    def __init__(self, path: str, signature: str, outputs: Union[str, Sequence[str], None]):
        self.path = path
        with local_copy(path, "SavedModel") as local:
            archive = SavedModelArchive.from_directory(local)
            function = _signature(load_saved_model(local), signature, path)
        _, input_specs = function.structured_input_signature
        self.inputs = [TensorInfo.from_tensor(name, spec) for name, spec in input_specs.items()]
        available = function.structured_outputs
        names = _selected_outputs(available, outputs, signature)
        self.kind = SINGLE if len(names) == 1 else DICT if outputs is None else LIST
        self.output_infos = [TensorInfo.from_tensor(name, available[name]) for name in names]
        shared = current_session().share(archive.data, "saved-model")
        self.handle = ModelHandle("saved_model", archive.key, shared, signature, tuple(names), self.kind)

    def inline_bytes(self) -> Any:
        """The SavedModel's tar to travel inside a task's function (a Connect stream's)."""
        with local_copy(self.path, "SavedModel") as local:
            return InlineBytes.of(SavedModelArchive.from_directory(local).data, "the SavedModel", _PUBLISH_INSTEAD)

    def elements(self, maps: BatchMaps, stored: tuple) -> MappedElements:
        """Batches of ``stored`` features after ``maps``."""
        return MappedElements.of_structure(maps, stored, None)

    def declared_inputs(self) -> List[TensorInfo]:
        """The signature's inputs."""
        return list(self.inputs)

    def feed(self, leaves: Sequence[specs.LeafSpec], names: Optional[Sequence[str]]) -> Feed:
        return plan_feed(self.inputs, DICT, leaves, names)

    def outputs(self, feed: Feed) -> Tuple[str, List[TensorInfo]]:
        return self.kind, self.output_infos


#: What :class:`TFPredictor` and :mod:`sparktf.ml` run: a Keras model or a SavedModel signature.
ModelSource = Union[KerasModelSource, SavedModelSource]


def _signature(loaded: Any, signature: str, path: str) -> Any:
    if signature not in loaded.signatures:
        raise DataError(
            f"the SavedModel at {path!r} has no signature {signature!r}; it has "
            f"{sorted(loaded.signatures.keys())}. Pass one of them as signature=..."
        )
    return loaded.signatures[signature]


def _selected_outputs(
    available: Dict[str, Any], outputs: Union[str, Sequence[str], None], signature: str
) -> List[str]:
    """The names of the outputs to return, in order."""
    wanted = [outputs] if isinstance(outputs, str) else sorted(available) if outputs is None else list(outputs)
    missing = [name for name in wanted if name not in available]
    if missing or not wanted:
        raise DataError(
            f"signature {signature!r} has no output(s) {missing or wanted}; its outputs are "
            f"{sorted(available)}. Pass some of them as outputs=..."
        )
    return wanted
