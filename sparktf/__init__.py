"""sparktf: distributed TensorFlow training and batch inference on Apache Spark.

The public names are imported lazily, so ``import sparktf`` is cheap and a
module is loaded the first time one of its names is used.
"""

import importlib
import importlib.util

if importlib.util.find_spec("tensorflow") is None:  # pragma: no cover - depends on the install
    raise ImportError(
        "sparktf needs TensorFlow, which is not installed in this Python "
        "environment (was sparktf installed with --no-deps?). Install it with "
        "pip install tensorflow, or on a machine with NVIDIA GPUs with "
        "pip install 'sparktf[gpu]' (tensorflow[and-cuda])."
    )

from sparktf import tf_startup as _tf_startup

_tf_startup.install()  # TensorFlow's start-up lines stay out of the output (sparktf.tf_startup)

__version__ = "0.1.0"

_EXPORTS = {
    "init_spark": "sparktf.context",
    "SparkTFError": "sparktf.errors",
    "DataError": "sparktf.errors",
    "TrainingError": "sparktf.errors",
    "CollectiveError": "sparktf.errors",
    "DriverJVMGone": "sparktf.errors",
    "TFDataset": "sparktf.dataset",
    "TFOptimizer": "sparktf.optimizer",
    "TFPredictor": "sparktf.predictor",
    "TFNet": "sparktf.net",
    "TrainSummary": "sparktf.summary",
    "ValidationSummary": "sparktf.summary",
    "MaxIteration": "sparktf.triggers",
    "MaxEpoch": "sparktf.triggers",
    "EveryEpoch": "sparktf.triggers",
    "SeveralIteration": "sparktf.triggers",
    "MinLoss": "sparktf.triggers",
    "MaxScore": "sparktf.triggers",
    "TriggerAnd": "sparktf.triggers",
    "TriggerOr": "sparktf.triggers",
    "run": "sparktf.launch.runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in ("optimizers", "layers"):  # subpackages: sparktf.layers.DynamicEmbedding without importing it first
        return importlib.import_module(f"sparktf.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sparktf' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
