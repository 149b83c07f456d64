"""Saving and loading the stages: ``pyspark.ml`` JSON metadata plus the model's own files.

A stage directory holds what ``DefaultParamsWriter`` writes (``metadata/``:
class, uid, the JSON-able Params, and a ``sparktf`` entry) and the model
beside it: ``model.keras`` (Keras' own format, no pickle of the model
object) or ``saved_model/``. ``Pipeline`` / ``PipelineModel`` save a Python
stage by calling its ``write().save(stage_dir)`` and load it by importing the
class named in the metadata and calling its ``load``, so the same code serves
both. Files move through Hadoop's ``FileSystem`` for the path, as the
metadata does, so HDFS, S3 and local paths all work.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Dict, Optional, Type

from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter
from pyspark.sql import SparkSession

from sparktf.errors import DataError
from sparktf.ml.params import OBJECT_PARAMS

__all__ = ["SavedStage", "StageWriter", "StageReader", "METADATA_KEY"]

#: The metadata entry holding the stage's own fields (model file, history, ...).
METADATA_KEY = "sparktf"


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

    def saveImpl(self, path: str) -> None:
        spark = self.sparkSession
        params = {p.name: v for p, v in self.instance._paramMap.items() if p.name not in OBJECT_PARAMS}
        local = tempfile.mkdtemp(prefix="sparktf-stage-")
        try:
            model_file = self.instance.write_model_files(local)
            extra = dict(self.instance.stage_metadata(), modelFile=model_file)
            DefaultParamsWriter.saveMetadata(
                self.instance, path, spark, extraMetadata={METADATA_KEY: extra}, paramMap=params
            )
            if model_file is not None:
                _file_system(spark, path).copyFromLocalFile(
                    False, True, _hadoop_path(spark, os.path.join(local, model_file)),
                    _hadoop_path(spark, _join(path, model_file)),
                )
        finally:
            shutil.rmtree(local, ignore_errors=True)


class StageReader(MLReader):
    """Loads a stage saved by :class:`StageWriter` into ``cls()`` through ``cls.restore(extra, local_file)``."""

    def __init__(self, cls: Type[Any]):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        spark = self.sparkSession
        metadata = DefaultParamsReader.loadMetadata(path, spark)
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
        local = tempfile.mkdtemp(prefix="sparktf-stage-")
        try:
            _file_system(spark, path).copyToLocalFile(
                False, _hadoop_path(spark, _join(path, model_file)), _hadoop_path(spark, local), True
            )
            instance.restore(extra, os.path.join(local, model_file))
        finally:
            shutil.rmtree(local, ignore_errors=True)
        return instance


def _join(path: str, name: str) -> str:
    return path.rstrip("/") + "/" + name


def _hadoop_path(spark: SparkSession, path: str) -> Any:
    return spark.sparkContext._jvm.org.apache.hadoop.fs.Path(path)


def _file_system(spark: SparkSession, path: str) -> Any:
    """Hadoop's FileSystem for ``path`` (the one the metadata was written to)."""
    return _hadoop_path(spark, path).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
