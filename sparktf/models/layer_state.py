"""What Keras saves of a model besides its config and weights: assets, and the own state of weightless layers.

``model.save("m.keras")`` keeps, next to the config and ``model.weights``:

* **assets**, the files a layer writes in ``save_assets``: the vocabulary of
  an adapted ``StringLookup``, ``IntegerLookup`` or ``TextVectorization``, a
  Keras Hub tokenizer's vocabulary and merges;
* LoRA enabled on a built layer (``backbone.enable_lora(rank)``), which adds
  weights its config does not mention;
* the variables that a layer without weights of its own keeps in
  ``save_own_variables``, such as a ``tf_idf`` lookup's IDF weights, and
  those of a layer that derives constants from its weights as they load
  (an adapted ``Normalization``'s mean and variance).

Without them a rebuilt model's lookup tables are empty ("Table not
initialized") and a tokenizer has no vocabulary. :func:`capture` collects both
with Keras' own traversal of a model (the paths ``model.save`` uses), and
:func:`restore` loads them into a model rebuilt from the same config, in the
order Keras' loader does: own variables, then assets. Weights assigned
directly (not through Keras' loader) leave constants derived from them stale:
:func:`weights_assigned` refreshes them.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Set, Tuple

import numpy as np

from sparktf.errors import ModelError
from sparktf.models.keras_internals import nested_layers

__all__ = ["LayerState", "capture", "restore", "weights_assigned"]


@dataclass(frozen=True)
class LayerState:
    """What one layer (or tokenizer, preprocessor) saves beyond its config and weights.

    Attributes
    ----------
    path : str
        Its place in the model, as ``model.save`` names it (``"layers/string_lookup"``,
        ``"preprocessor/tokenizer"``).
    class_name : str
        Its class, to name it in errors.
    assets : tuple of (str, bytes)
        The files ``save_assets`` wrote, by path relative to its folder.
    variables : tuple of (str, numpy.ndarray)
        What ``save_own_variables`` stored, for a layer with no ``weights`` of its own.
    lora : tuple
        ``(rank, alpha)`` of a layer whose LoRA was enabled after it was made
        (``backbone.enable_lora(rank)``), which its config does not say; empty
        otherwise.
    """

    path: str
    class_name: str
    assets: Tuple[Tuple[str, bytes], ...] = ()
    variables: Tuple[Tuple[str, np.ndarray], ...] = ()
    lora: Tuple[int, float] = ()


def capture(model: Any) -> Tuple[LayerState, ...]:
    """The assets and weightless layers' own variables of ``model``, by Keras' save path.

    Raises
    ------
    ModelError
        When a layer cannot save its state, e.g. a tokenizer with no
        vocabulary set: it could not be rebuilt anywhere.
    """
    states = []
    with tempfile.TemporaryDirectory(prefix="sparktf-assets-") as root:
        for index, (path, saveable) in enumerate(_saveables(model)):
            assets = _saved_assets(saveable, path, os.path.join(root, str(index)))
            variables = _own_variables(saveable, path)
            lora = _enabled_lora(saveable)
            if assets or variables or lora:
                states.append(LayerState(path, type(saveable).__name__, assets, variables, lora))
    return tuple(states)


def restore(model: Any, states: Tuple[LayerState, ...]) -> bool:
    """Load ``states`` (from :func:`capture`) into ``model``, rebuilt from the same config; whether that added
    variables (LoRA).

    Raises
    ------
    ModelError
        When the model has no layer at a captured path, or a layer fails to
        load its state (naming the layer and what it could not load).
    """
    if not states:
        return False
    added = False
    by_path = dict(_saveables(model))
    with tempfile.TemporaryDirectory(prefix="sparktf-assets-") as root:
        for index, state in enumerate(states):
            saveable = by_path.get(state.path)
            if saveable is None:
                raise ModelError(
                    f"the rebuilt model has no layer at {state.path!r} ({state.class_name}), whose saved state "
                    "(vocabulary, lookup table) the model carries: its config does not rebuild the same layers. "
                    "Check that the model's get_config() describes every layer it creates."
                )
            try:
                if state.lora and not saveable.lora_enabled:  # before the weights: it adds two per layer
                    saveable.enable_lora(state.lora[0], lora_alpha=state.lora[1])
                    added = True
                if state.variables:
                    saveable.load_own_variables(dict(state.variables))
                if state.assets:
                    saveable.load_assets(_written(state.assets, os.path.join(root, str(index))))
            except Exception as exc:  # a layer's own loader: anything it raises means the model is unusable
                raise ModelError(
                    f"layer {state.path!r} ({state.class_name}) could not load its saved state "
                    f"({_described(state)}): {type(exc).__name__}: {exc}"
                ) from exc
    return added


def weights_assigned(model: Any) -> None:
    """Refresh what layers derive from their weights when Keras loads them, after assigning ``model.weights``.

    An adapted ``Normalization`` computes its mean and variance constants from
    its weights in ``finalize_state``, which its ``load_own_variables`` calls:
    every layer that overrides ``load_own_variables``, has weights and a
    ``finalize_state`` gets that call here.
    """
    for layer in nested_layers(model):
        if _derives_from_weights(layer):
            layer.finalize_state()


def _derives_from_weights(layer: Any) -> bool:
    """Whether ``layer`` computes constants from its weights when Keras loads them (an adapted ``Normalization``)."""
    import keras

    return (isinstance(layer, keras.layers.Layer) and bool(layer.weights) and hasattr(layer, "finalize_state")
            and type(layer).load_own_variables is not keras.layers.Layer.load_own_variables)


def _saveables(model: Any) -> Iterator[Tuple[str, Any]]:
    """``(path, object)`` of every saveable in ``model``, as Keras' ``model.save`` walks them (each once)."""
    from keras.src.saving.keras_saveable import KerasSaveable
    from keras.src.saving.saving_lib import _walk_saveable

    visited: Set[int] = set()

    def walk(node: Any, path: str) -> Iterator[Tuple[str, Any]]:
        if isinstance(node, KerasSaveable):
            if id(node) in visited:
                return
            visited.add(id(node))
            yield path, node
            children = _walk_saveable(node)
        elif isinstance(node, dict):
            children = ((str(key), value) for key, value in node.items())
        elif isinstance(node, (list, tuple)):
            children = _container_children(node)
        else:
            return
        for name, child in children:
            if isinstance(child, (KerasSaveable, list, tuple, dict)):
                yield from walk(child, f"{path}/{name}" if path else name)

    yield from walk(model, "")


def _container_children(items: Any) -> Iterator[Tuple[str, Any]]:
    """A list's saveables named as Keras names them: by their ``name``, made unique with a suffix."""
    used: Dict[str, int] = {}
    for item in items:
        name = getattr(item, "name", None)
        if not isinstance(name, str):
            continue
        count = used.get(name, 0)
        used[name] = count + 1
        yield (name if count == 0 else f"{name}_{count}"), item


def _saved_assets(saveable: Any, path: str, folder: str) -> Tuple[Tuple[str, bytes], ...]:
    if not hasattr(saveable, "save_assets"):
        return ()
    os.makedirs(folder)
    try:
        saveable.save_assets(folder)
    except Exception as exc:  # e.g. "No vocabulary has been set for WordPieceTokenizer"
        raise ModelError(
            f"layer {path or '(the model)'!r} ({type(saveable).__name__}) cannot save its assets, so it could "
            f"not be rebuilt on the executors: {type(exc).__name__}: {exc}. Set its vocabulary (or adapt it) "
            "before training or predicting."
        ) from exc
    files = []
    for directory, _, names in os.walk(folder):
        for name in names:
            full = os.path.join(directory, name)
            with open(full, "rb") as file:
                files.append((os.path.relpath(full, folder), file.read()))
    return tuple(sorted(files))


def _own_variables(saveable: Any, path: str) -> Tuple[Tuple[str, np.ndarray], ...]:
    """What a layer stores in ``save_own_variables`` when its weights do not say it all.

    That is a layer without weights (a ``tf_idf`` lookup's IDF weights), and a
    layer that computes constants from its weights as they load (an adapted
    ``Normalization``): its statistics travel in the model itself, so that a
    model rebuilt without weights is traced with its real constants. Other
    layers' weights travel as ``model.weights``; the optimizer's and the
    metrics' variables on their own.
    """
    import keras

    if not isinstance(saveable, keras.layers.Layer) or (saveable.weights and not _derives_from_weights(saveable)):
        return ()
    store: Dict[str, Any] = {}
    saveable.save_own_variables(store)
    return tuple(sorted((key, np.asarray(value)) for key, value in store.items()))


def _enabled_lora(saveable: Any) -> Tuple[int, float]:
    """``(rank, alpha)`` of a layer with LoRA enabled, else ``()``."""
    if not getattr(saveable, "lora_enabled", False):
        return ()
    return (int(saveable.lora_rank), float(saveable.lora_alpha))


def _written(assets: Tuple[Tuple[str, bytes], ...], folder: str) -> str:
    for name, data in assets:
        full = os.path.join(folder, name)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as file:
            file.write(data)
    return folder


def _described(state: LayerState) -> str:
    parts = [f"asset {name}" for name, _ in state.assets] + [f"variable {key}" for key, _ in state.variables]
    parts += [f"LoRA of rank {state.lora[0]}"] if state.lora else []
    return ", ".join(parts)
