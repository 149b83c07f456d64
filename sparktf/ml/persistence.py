"""Saving and loading the stages: ``pyspark.ml`` JSON metadata plus the model's own files.

A stage folder holds what ``DefaultParamsWriter`` writes (``metadata/part-00000``:
class, uid, the JSON-able Params, and a ``sparktf`` entry) and the model
beside it: ``model.keras`` (Keras' own format, no pickle of the model
object) or ``saved_model/``. ``Pipeline`` / ``PipelineModel`` save a Python
stage by calling its ``write().save(stage_dir)`` and load it by importing the
class named in the metadata and calling its ``load``, so the same code serves
both. Every file moves through :mod:`sparktf.storage`, like every other path
of sparktf: Hadoop's ``FileSystem`` for a scheme the classic session knows
(HDFS, and S3 or GCS with the cluster's connector), else fsspec.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Dict, Optional, Type

from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from sparktf.errors import DataError, StorageError
from sparktf.ml.params import OBJECT_PARAMS
from sparktf.storage import join, local_copy, read_text, store_for, write_text

__all__ = ["SavedStage", "StageWriter", "StageReader", "METADATA_KEY"]

#: The metadata entry holding the stage's own fields (model file, history, ...).
METADATA_KEY = "sparktf"

#: The metadata file, where Spark's own ``DefaultParamsWriter`` puts it (``spark.read.text`` reads it).
_METADATA_FILE = "metadata/part-00000"


class SavedStage(MLReadable, MLWritable):
    """``write()`` / ``read()`` of a stage that has ``stage_metadata()`` and ``write_model_files(local_dir)``."""

    def write(self) -> "StageWriter":
        """Saves the Params as JSON metadata and the model's own files beside them."""
        return StageWriter(self)

    @classmethod
    def read(cls) -> "StageReader":
        return StageReader(cls)


class StageWriter(MLWriter):
    """Writes a stage with ``stage_metadata()`` and ``write_model_files(local_dir) -> file name or None``."""

    def __init__(self, instance: Any):
        super().__init__()
        self.instance = instance

    def save(self, path: str) -> None:
        """Save the stage to ``path`` (a local path or a URI); ``overwrite()`` first replaces what is there.

        Raises
        ------
        StorageError
            When ``path`` exists and ``overwrite()`` was not called, or it cannot be written.
        """
        store = store_for(path, "stage path")
        if store.exists(path):
            if not self.shouldOverwrite:
                raise StorageError(f"{path!r} already exists: save with .write().overwrite().save(path) to "
                                   "replace it, or choose another path")
            store.delete(path, recursive=True)
        self.saveImpl(path)

    def saveImpl(self, path: str) -> None:
        params = {p.name: v for p, v in self.instance._paramMap.items() if p.name not in OBJECT_PARAMS}
        local = tempfile.mkdtemp(prefix="sparktf-stage-")
        try:
            model_file = self.instance.write_model_files(local)
            extra = dict(self.instance.stage_metadata(), modelFile=model_file)
            metadata = DefaultParamsWriter._get_metadata_to_save(
                self.instance, self.sparkSession, extraMetadata={METADATA_KEY: extra}, paramMap=params
            )
            if model_file is not None:
                store_for(path, "stage path").upload(os.path.join(local, model_file), join(path, model_file))
            write_text(join(path, _METADATA_FILE), metadata + "\n", "stage metadata")  # last: a stage is whole
        finally:
            shutil.rmtree(local, ignore_errors=True)


class StageReader(MLReader):
    """Loads a stage saved by :class:`StageWriter` into ``cls()`` through ``cls.restore(extra, local_file)``."""

    def __init__(self, cls: Type[Any]):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        metadata = DefaultParamsReader._parseMetaData(_metadata_text(path))
        expected = f"{self.cls.__module__}.{self.cls.__name__}"
        if metadata["class"] != expected:
            raise DataError(
                f"{path!r} holds a {metadata['class']}, not a {expected}: load it with that class "
                "(or with DefaultParamsReader.loadParamsInstance)"
            )
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata, skipParams=list(OBJECT_PARAMS))
        extra: Dict[str, Any] = metadata.get(METADATA_KEY, {})
        model_file: Optional[str] = extra.get("modelFile")
        if model_file is None:
            instance.restore(extra, None)
            return instance
        with local_copy(join(path, model_file), "saved stage's model") as local:
            instance.restore(extra, local)
        return instance


def _metadata_text(path: str) -> str:
    """The metadata JSON of the stage at ``path`` (the first line of its ``metadata/part-*`` file)."""
    store = store_for(path, "stage path")
    folder = join(path, "metadata")
    parts = [name for name in store.listdir(folder) if name.startswith("part-")]
    if not parts:
        raise StorageError(f"{path!r} holds no saved stage (no {folder}/part-* file): pass the path a stage "
                           "or PipelineModel was saved to")
    return read_text(join(folder, parts[0]), "stage metadata").splitlines()[0]
