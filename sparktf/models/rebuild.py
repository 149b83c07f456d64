"""Rebuilding a Keras model from its config as the captured one was, where the config alone does not say it.

:class:`~sparktf.models.payload.ModelPayload` rebuilds a model from its Keras
config; these make the rebuilt model behave as the captured one: the global
dtype policy it was built under, a custom ``compile`` (a Keras Hub task's) and
its own arguments, which weights were frozen after the layers were made, and
the packages its classes come from (naming the extra to install).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import sys
from typing import Any, Iterator, Mapping, Optional, Tuple

from sparktf.errors import InternalError, ModelError

__all__ = ["register_sparktf_classes", "freeze_as_captured", "require_packages", "keep_custom_compile_arguments", "compile_as_captured",
           "global_policy", "policy_named", "config_native_models", "resize_tables"]


def register_sparktf_classes() -> None:
    """Register sparktf's own Keras classes (``sparktf>RowWiseAdagrad``, ``sparktf>LazyAdam``,
    ``sparktf>DynamicEmbedding``) in this process, before a model that may hold them is deserialized."""
    importlib.import_module("sparktf.optimizers")
    importlib.import_module("sparktf.layers")


def freeze_as_captured(model: Any, trainable: Tuple[bool, ...]) -> bool:
    """Set each weight's ``trainable`` as it was captured (a rebuilt backbone whose LoRA froze the rest); whether
    any changed."""
    variables = model.weights
    if len(variables) != len(trainable):  # assigning the weights (now or from a state) names the mismatch
        return False
    changed = False
    for variable, flag in zip(variables, trainable):
        if bool(variable.trainable) != flag:
            variable.trainable = flag
            changed = True
    return changed


#: Packages a model's classes may come from, and the sparktf extra that installs each.
_EXTRAS = {"keras_hub": "hub"}


def resize_tables(config: dict, rows: Mapping[str, int]) -> None:
    """Give the ``Embedding`` layers ``rows`` names (by layer name) that many rows in the model's ``config``: a
    sharded table's working table, so that a worker never builds the whole table."""
    layers = {layer["config"].get("name"): layer for layer in config.get("config", {}).get("layers", ())
              if layer.get("class_name") == "Embedding"}
    missing = sorted(set(rows) - set(layers))
    if missing:
        raise InternalError(f"the model's config has no top-level Embedding layers {missing} to resize")
    for name, count in rows.items():
        layers[name]["config"]["input_dim"] = int(count)


def require_packages(config: dict) -> None:
    """Raise ``ModelError`` naming the extra to install when the model's classes come from a package this process
    lacks (a Keras Hub task on executors without ``keras_hub``)."""
    package = str(config.get("module") or "").split(".", 1)[0]
    if package in _EXTRAS and importlib.util.find_spec(package) is None:
        raise ModelError(
            f"the model is a {config.get('class_name')} from {package!r}, which this Python ({sys.executable}) "
            f"cannot import: install it where the model runs, e.g. pip install 'sparktf[{_EXTRAS[package]}]' on "
            "the executors (or ship it with spark.archives / a conda environment)"
        )


def keep_custom_compile_arguments(model: Any, config: dict) -> None:
    """Add to ``config``'s compile config the arguments of a custom ``compile`` that the model keeps under the same
    name and Keras does not (a Keras Hub ``CausalLM``'s ``sampler``), so the rebuilt model generates alike."""
    import keras

    compile_config = config.get("compile_config")
    if compile_config is None or type(model).compile is keras.Model.compile:
        return
    for name, parameter in inspect.signature(type(model).compile).parameters.items():
        if name == "self" or name in compile_config or parameter.kind in (parameter.VAR_POSITIONAL,
                                                                           parameter.VAR_KEYWORD):
            continue
        value = getattr(model, name, None)
        if value is not None and hasattr(value, "get_config"):
            compile_config[name] = keras.saving.serialize_keras_object(value)


def compile_as_captured(model: Any, compile_config: Optional[dict], variables_changed: bool) -> None:
    """Compile the rebuilt model as the captured one was, where Keras' rebuild did not.

    Keras does not compile a model whose class overrides ``compile`` (a Keras
    Hub task compiles itself with defaults): its ``compile`` gets the
    arguments ``get_compile_config`` kept, as Keras' own would. A model whose
    trainable variables changed after Keras compiled it (LoRA enabled,
    weights frozen) is compiled again, so its optimizer is built for them.
    """
    import keras

    if not compile_config or (type(model).compile is keras.Model.compile and not variables_changed):
        return
    model.compile(**keras.saving.deserialize_keras_object(compile_config))
    if model.built:
        model.optimizer.build(model.trainable_variables)




@contextlib.contextmanager
def global_policy(config: dict) -> Iterator[None]:
    """Keras' global dtype policy set to the model's own while it is rebuilt and compiled.

    ``compile`` wraps the optimizer in a ``LossScaleOptimizer`` only when the
    model's policy is ``mixed_float16``, and a rebuilt model takes its policy
    from the global one: without this, an executor whose global policy is
    ``float32`` would build a plain optimizer with fewer variables.
    """
    name = _mixed_policy(config.get("config") or {})
    if name is None:
        yield
        return
    with policy_named(name):
        yield


@contextlib.contextmanager
def policy_named(name: str) -> Iterator[None]:
    """Keras' global dtype policy set to ``name`` inside the block."""
    import keras

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _mixed_policy(config: dict) -> Optional[str]:
    """The ``mixed_*`` policy a model was built under, or None.

    A functional model's config has no ``dtype`` of its own (its policy was
    the global one when it was made): its layers' policies say it.
    """
    own = config.get("dtype")
    policies = [own] if own is not None else [(layer.get("config") or {}).get("dtype")
                                              for layer in config.get("layers", ())]
    for policy in policies:
        name = policy.get("config", {}).get("name") if isinstance(policy, dict) else policy
        if isinstance(name, str) and name.startswith("mixed_"):
            return name
    return None


def config_native_models() -> tuple:
    """Model classes whose config always rebuilds them (functional and Sequential)."""
    import keras
    from keras.src.models.functional import Functional

    return (Functional, keras.Sequential)
