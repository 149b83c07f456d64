"""The driver's check that the executors can rebuild a model: a functional graph that calls a layer whose state
is loaded from assets (a Keras Hub tokenizer, a preprocessor holding one) cannot be rebuilt before those assets
are loaded, by Keras' own ``load_model`` neither. Such a model is refused here, in a fraction of a second, instead
of failing on every executor once the job has started."""

from __future__ import annotations

from typing import Any, List

from sparktf.errors import DataError, ModelError
from sparktf.models.keras_internals import is_functional, nested_layers
from sparktf.models.payload import ModelPayload

__all__ = ["check_rebuildable"]


def check_rebuildable(model: Any) -> None:
    """Rebuild ``model``'s architecture (no weights) when its graph calls a layer with assets; a ``ModelError``
    naming those layers and the way out when that fails.

    Raises
    ------
    ModelError
        When the model cannot be rebuilt from its config.
    """
    holders = _asset_layers_in_graph(model)
    if not holders:
        return
    try:
        ModelPayload.from_model(model, include_optimizer=False, include_weights=False).build()
    except (DataError, ModelError, ValueError, TypeError) as exc:
        raise ModelError(
            f"the model cannot be rebuilt on the executors: its graph calls {holders}, whose vocabulary or other "
            "assets are loaded only after the graph is built (Keras' save and load_model fail on it too). Train "
            "the Keras Hub task with its own preprocessor (e.g. keras_hub.models.TextClassifier(backbone, "
            "preprocessor=...)), or tokenize in a TFDataset.map function before the model. What Keras said: "
            f"{str(exc).strip().splitlines()[0][:300]}") from None


def _asset_layers_in_graph(model: Any) -> List[str]:
    """The layers of ``model``'s functional graph that hold (or are) a Keras Hub layer loading assets (a tokenizer),
    as ``name (Class)``."""
    if not is_functional(model) or getattr(model, "preprocessor", None) is not None:
        return []  # a subclassed model rebuilds by its own code; a Keras Hub task runs its preprocessor apart
    found = []
    for layer in model.layers:
        inner = nested_layers(layer, include_self=True)
        if any(callable(getattr(sub, "load_assets", None)) and type(sub).__module__.startswith("keras_hub.")
               for sub in inner):  # Keras' own lookups keep their vocabularies in the payload (layer_state)
            found.append(f"{layer.name} ({type(layer).__name__})")
    return found
