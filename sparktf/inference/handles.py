"""What the executors get of a predictor's model: one handle class per kind, each loading its model once per worker.

A handle travels in a prediction task's function. Its :meth:`~ModelHandle.runner`
loads the model through :mod:`sparktf.models.cache` (once per Python worker)
and returns a runner of :mod:`sparktf.inference.runners`, kept on the model's
cache entry:

* :class:`KerasHandle`: a Keras model shipped as payload bytes, keyed by their
  content hash;
* :class:`PublishedHandle`: the newest version published to a ``model_dir``,
  keyed by the folder and the version a task pins (:meth:`~ModelHandle.pinned`);
* :class:`GenerationHandle`: ``method="generate"`` on either of those, with
  its checked options (and the cache layout the driver probed);
* :class:`SavedModelHandle`: one signature of a SavedModel shipped as a tar,
  keyed by its content hash.

Every handle also carries the job's settings: the stage's GPU plan and the
dataset's batch maps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Union

from sparktf.data.batch_maps import MappedElements
from sparktf.errors import DataError
from sparktf.inference.feeds import SINGLE
from sparktf.inference.generation import WINDOW_BATCHES, GenerationEngine, GenerationOptions
from sparktf.inference.runners import GenerateRunner, KerasRunner, SignatureRunner
from sparktf.models.cache import cached, derived
from sparktf.models.payload import ModelPayload
from sparktf.models.published import PublishedVersion, load_version, newest_version
from sparktf.models.saved_model_archive import SavedModelArchive
from sparktf.spark.task_devices import GpuPlan, prepare_tensorflow_task
from sparktf.spark.worker_gc import frozen_after

__all__ = ["ModelHandle", "KerasHandle", "PublishedHandle", "GenerationHandle", "SavedModelHandle"]


@dataclass(frozen=True, kw_only=True)
class ModelHandle:
    """What every handle carries: the stage's GPU plan and the dataset's batch maps (set per job)."""

    gpus: GpuPlan = GpuPlan()
    elements: Optional[MappedElements] = None

    @property
    def nullable_output(self) -> bool:
        """Whether a record's output may be null (only generation's, with ``on_error="null"``)."""
        return False

    def for_batch(self, batch: int) -> Tuple["ModelHandle", int]:
        """This handle for batches of ``batch`` records, and the records each runner call gets."""
        return self, batch

    def pinned(self) -> "ModelHandle":
        """This handle with what a whole task runs fixed (only a published model's version changes)."""
        return self

    def runner(self) -> Callable[[Any], Any]:
        """The runner of this process (loads the model on the first call).

        Inside a Spark task, TensorFlow is first bound to the task's GPUs and
        its threads set to ``spark.task.cpus`` (as for training), so concurrent
        tasks do not compete for the same GPUs and cores. A freshly loaded
        model is frozen out of the garbage collector's full collections (see
        :mod:`sparktf.spark.worker_gc`).
        """
        prepare_tensorflow_task(self.gpus)
        return self._loaded_runner()

    def _loaded_runner(self) -> Callable[[Any], Any]:
        raise NotImplementedError

    def with_bytes(self, data: Any) -> "ModelHandle":
        """This handle with the model's bytes ``data`` travelling inside the task's function (a Connect stream's)
        instead of the shared ones: a new ``broadcast`` (the handles without one override this)."""
        return dataclasses.replace(self, broadcast=data)


class _KerasModel(ModelHandle):
    """A handle of a Keras model: called on batches (``model(x, training=False)``) by a :class:`KerasRunner`."""

    def keras_model(self, use: str) -> Any:
        """This process's Keras model for ``use`` (``"predict"`` or ``"generate"``: a model object each)."""
        key, build = self._cache_key_and_builder()
        return cached(f"keras-{use}:{key}", frozen_after(build))

    def _cache_key_and_builder(self) -> Tuple[str, Callable[[], Any]]:
        raise NotImplementedError

    def _loaded_runner(self) -> Callable[[Any], Any]:
        return derived(self.keras_model("predict"), "keras-runner", KerasRunner)


@dataclass(frozen=True, kw_only=True)
class KerasHandle(_KerasModel):
    """A Keras model's payload bytes (``broadcast``: a broadcast variable or a session artifact, see
    ``SessionKind.share``), keyed by their content hash ``key``."""

    key: str
    broadcast: Any

    def _cache_key_and_builder(self) -> Tuple[str, Callable[[], Any]]:
        return self.key, lambda: ModelPayload.from_bytes(self.broadcast.value).build()


@dataclass(frozen=True, kw_only=True)
class PublishedHandle(_KerasModel):
    """The newest version published to the ``model_dir`` ``folder``, as the executors address it: each task scores
    with the ``version`` it pins, which must keep the inputs and outputs ``io_signature``."""

    folder: str
    io_signature: Optional[Dict[str, Any]] = None
    version: Optional[PublishedVersion] = None

    def pinned(self) -> "PublishedHandle":
        """This handle with the newest published version looked up now, for a whole task: a running query takes a
        new version from its next micro-batch on, and a task never mixes two.

        Raises
        ------
        DataError
            No version is left, or the newest one takes other inputs or gives other outputs than the one the
            predictor was made with.
        """
        if self.version is not None:
            return self
        version = newest_version(self.folder)
        if version is None:
            raise DataError(f"no published version is left in {self.folder!r}: it was deleted while scoring")
        found = version.manifest.get("signature")
        if self.io_signature is not None and found is not None and found != self.io_signature:
            raise DataError(f"published version {version.version} of {self.folder!r} takes {found} but the predictor "
                            f"was made for {self.io_signature}: every version must keep the inputs and outputs of "
                            "the first; make the TFPredictor again for the new model")
        return dataclasses.replace(self, version=version)

    def with_bytes(self, data: Any) -> "PublishedHandle":
        """This handle itself: its tasks read the versions from the folder."""
        return self

    def _cache_key_and_builder(self) -> Tuple[str, Callable[[], Any]]:
        version = self.pinned().version
        return f"{self.folder}#{version.version}", lambda: load_version(version)


@dataclass(frozen=True, kw_only=True)
class GenerationHandle(ModelHandle):
    """``method="generate"`` on a Keras ``model`` (a Keras Hub ``CausalLM``) with its checked ``options``, in
    batches of ``batch_size`` prompts (set per job by :meth:`for_batch`)."""

    model: Union[KerasHandle, PublishedHandle]
    options: GenerationOptions
    batch_size: int = 0

    @property
    def nullable_output(self) -> bool:
        """Whether a completion may be null (``on_error="null"``)."""
        return self.options.on_error == "null"

    @property
    def version(self) -> Optional[PublishedVersion]:
        """The published version a task generates with (see :meth:`PublishedHandle.pinned`)."""
        return self.model.version

    def for_batch(self, batch: int) -> Tuple["GenerationHandle", int]:
        """This handle for batches of ``batch`` prompts, and a window of
        :data:`~sparktf.inference.generation.WINDOW_BATCHES` batches per runner call, sorted by length inside it."""
        return dataclasses.replace(self, batch_size=batch), batch * WINDOW_BATCHES

    def pinned(self) -> "GenerationHandle":
        """This handle with its model's version pinned for a whole task (see :meth:`PublishedHandle.pinned`)."""
        return dataclasses.replace(self, model=self.model.pinned())

    def with_bytes(self, data: Any) -> "GenerationHandle":
        """This handle with its model's bytes ``data`` travelling inside the task's function."""
        return dataclasses.replace(self, model=self.model.with_bytes(data))

    def _loaded_runner(self) -> Callable[[Any], Any]:
        engine = derived(self.model.keras_model("generate"), f"generation-engine/{self.options!r}",
                         lambda lm: GenerationEngine(lm, self.options))
        return GenerateRunner(engine, self.batch_size)


@dataclass(frozen=True, kw_only=True)
class SavedModelHandle(ModelHandle):
    """A SavedModel's tar (``broadcast``, as :class:`KerasHandle`'s), keyed by its content hash ``key``: its
    ``signature`` called, its ``outputs`` picked and returned as ``output_kind``."""

    key: str
    broadcast: Any
    signature: str
    outputs: Tuple[str, ...]
    output_kind: str = SINGLE

    def _loaded_runner(self) -> Callable[[Any], Any]:
        loaded = cached("saved-model:" + self.key,
                        frozen_after(lambda: SavedModelArchive(self.broadcast.value, self.key).load()))
        return SignatureRunner(loaded, self.signature, self.outputs, self.output_kind)
