"""The models a ``TFPredictor`` (and a ``sparktf.ml.KerasModel``) runs, described on the driver.

A *model source* knows its model's inputs and outputs (:class:`TensorInfo`),
how a batch's leaves feed them, and the handle the executors load it from
(:mod:`sparktf.inference.handles`): a Keras model called on batches
(:class:`KerasModelSource`), ``method="generate"`` on a Keras Hub ``CausalLM``
(:class:`GenerationSource`), a SavedModel signature (:class:`SavedModelSource`).
A Keras model is shipped as its payload's bytes (:func:`keras_source`), or each
task reads the newest version published to a ``model_dir``
(:func:`published_source`).
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
from sparktf.inference.handles import GenerationHandle, KerasHandle, PublishedHandle, SavedModelHandle
from sparktf.models.payload import ModelPayload
from sparktf.models.published import load_version, newest_version
from sparktf.models.saved_model_archive import SavedModelArchive, load_saved_model
from sparktf.spark.session_kind import InlineBytes
from sparktf.storage import local_copy, store_for

__all__ = ["KerasModelSource", "GenerationSource", "SavedModelSource", "ModelSource", "keras_source",
           "published_source"]

#: What to do instead of shipping a large model inside a Connect stream's plan.
_PUBLISH_INSTEAD = ("train or save it to a model_dir the executors can read and score the stream with "
                    "TFPredictor.from_published(model_dir, ...), whose tasks read it themselves")


class KerasModelSource:
    """A Keras model on the driver, called on batches: ``model(x, training=False)`` after the model's own
    preprocessing, as ``model.predict``.

    Parameters
    ----------
    model : keras.Model
        The model (for a published one: the newest version now, whose inputs and outputs every later one keeps).
    located : PublishedHandle, optional
        Where the executors read it: a ``model_dir``'s published versions; default: its payload's bytes, shared
        once.
    version_col : str, optional
        The output column of the number of the version that scored a row (published versions only).
    """

    def __init__(self, model: Any, located: Optional[PublishedHandle] = None, version_col: Optional[str] = None):
        self.model, self.version_col = model, version_col
        self.located = located or _shipped(model)
        self.handle: Union[KerasHandle, PublishedHandle, GenerationHandle] = self.located

    def inline_bytes(self) -> Any:
        """The model's bytes to travel inside a task's function (a Connect stream's, see
        ``predictor.dataframe_with_predictions``); None for published versions: the tasks read them from
        ``model_dir``."""
        if isinstance(self.located, PublishedHandle):
            return None
        payload = ModelPayload.from_model(self.model, include_optimizer=False).to_bytes()
        return InlineBytes.of(payload, "the model", _PUBLISH_INSTEAD)

    def elements(self, maps: BatchMaps, stored: tuple) -> MappedElements:
        """Batches of ``stored`` features as the model gets them: after ``maps`` and the model's preprocessing."""
        return MappedElements.of_structure(maps, stored, self.model)

    def declared_inputs(self) -> Optional[List[TensorInfo]]:
        """The inputs the model declares (None: it declares none)."""
        declared = keras_inputs(self.model)
        return None if declared is None else declared[0]

    def feed(self, leaves: Sequence[specs.LeafSpec], names: Optional[Sequence[str]]) -> Feed:
        return keras_feed(self.model, leaves, names)

    def outputs(self, feed: Feed) -> Tuple[str, List[TensorInfo]]:
        import keras

        symbolic = [keras.KerasTensor((None,) + info.shape, dtype=specs.dtype_name(info.dtype)) for info in feed.inputs]
        spec = self.model.compute_output_spec(feed.structured(symbolic))
        if isinstance(spec, dict):
            return DICT, [TensorInfo.from_tensor(name, t) for name, t in spec.items()]
        if isinstance(spec, (list, tuple)):
            return LIST, [TensorInfo.from_tensor(f"output_{i}", t) for i, t in enumerate(spec)]
        return SINGLE, [TensorInfo.from_tensor("output", spec)]


class GenerationSource(KerasModelSource):
    """``model.generate`` (a Keras Hub ``CausalLM``) on prompts, with ``options`` checked (see
    :func:`~sparktf.inference.generation.generation_options`); the other parameters as
    :class:`KerasModelSource`'s."""

    def __init__(self, model: Any, options: GenerationOptions, located: Optional[PublishedHandle] = None,
                 version_col: Optional[str] = None):
        super().__init__(model, located, version_col)
        self.handle = GenerationHandle(model=self.located, options=options)

    def elements(self, maps: BatchMaps, stored: tuple) -> MappedElements:
        """Batches of ``stored`` prompts after ``maps`` (``generate`` preprocesses prompts itself)."""
        return MappedElements.of_structure(maps, stored, None)

    def declared_inputs(self) -> None:
        """None: the prompts are the input."""
        return None

    def feed(self, leaves: Sequence[specs.LeafSpec], names: Optional[Sequence[str]]) -> Feed:
        return plan_feed([TensorInfo("prompt", np.dtype(object), ())], SINGLE, leaves, names)

    def outputs(self, feed: Feed) -> Tuple[str, List[TensorInfo]]:
        return SINGLE, [TensorInfo("completion", np.dtype(str), ())]


def keras_source(model: Any, method: str = "call", options: Optional[Dict[str, Any]] = None,
                 located: Optional[PublishedHandle] = None, version_col: Optional[str] = None) -> KerasModelSource:
    """The source of ``model`` run with ``method``: ``"call"`` (:class:`KerasModelSource`) or ``"generate"``
    (:class:`GenerationSource`, ``options`` its keywords); ``located`` and ``version_col`` as
    :class:`KerasModelSource`'s.

    Raises
    ------
    DataError
        For another ``method``, or ``"generate"`` with a model that has no ``generate``.
    ConfigurationError
        For ``options`` with ``"call"``, or ones ``generate`` does not take (see ``generation_options``).
    """
    if method not in ("call", "generate"):
        raise DataError(f"method must be 'call' or 'generate', got {method!r}")
    if method == "generate" and not callable(getattr(model, "generate", None)):
        raise DataError(f"method='generate' needs a model with a generate() method (a Keras Hub CausalLM); "
                        f"{type(model).__name__} has none")
    if options and method != "generate":
        raise ConfigurationError(f"keywords {sorted(options)} go to the model's method; model(x) takes none. "
                                 "Pass method='generate' to generate text")
    if method == "generate":
        return GenerationSource(model, generation_options(model, options or {}), located, version_col)
    return KerasModelSource(model, located, version_col)


def published_source(model_dir: str, method: str = "call", options: Optional[Dict[str, Any]] = None,
                     version_col: Optional[str] = None) -> KerasModelSource:
    """The source of the newest version published to ``model_dir`` (``optimize_stream``'s), run with ``method``
    (as :func:`keras_source`): each task loads the newest version when it starts, so a running streaming query picks
    up new ones. The driver reads the newest one now for the inputs and outputs, which every later version must
    keep. With ``version_col``, each output row carries the number of the version that scored it.

    Raises
    ------
    DataError
        When nothing is published in ``model_dir`` (and as :func:`keras_source`).
    """
    version = newest_version(model_dir)
    if version is None:
        raise DataError(f"no version is published in {model_dir!r} (no {model_dir}/published/<n>/manifest.json): "
                        "run TFOptimizer.optimize_stream with publish_every=... first")
    located = PublishedHandle(folder=store_for(model_dir, "model_dir").executor_uri(model_dir),
                              io_signature=version.manifest.get("signature"))
    return keras_source(load_version(version), method, options, located, version_col)


def _shipped(model: Any) -> KerasHandle:
    """The handle of ``model``'s payload bytes, shared once with the executors."""
    payload = ModelPayload.from_model(model, include_optimizer=False)
    return KerasHandle(key=payload.key, broadcast=current_session().share(payload.to_bytes(), "model"))


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
        self.handle = SavedModelHandle(key=archive.key, broadcast=current_session().share(archive.data, "saved-model"),
                                       signature=signature, outputs=tuple(names), output_kind=self.kind)

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
