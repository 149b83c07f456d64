"""Published model versions: ``<model_dir>/published/<version>/`` with ``model.keras`` and ``manifest.json``.

A streaming ``TFOptimizer.optimize_stream`` publishes; ``TFPredictor.from_published``
scores with the newest version. A version exists for readers once its
manifest does: the writer uploads ``model.keras`` first (complete or not at
all, through :mod:`sparktf.storage`), then the manifest, so a reader never
sees a partial version on a local disk or an object store alike. Versions
are numbered 1, 2, ... in the order they are published; a folder that a
writer killed mid-way left without a manifest is reused by the next version
of its number.

A :class:`VersionWriter` with ``full_every=N`` writes *delta* versions between
full ones: ``delta.npz`` holds the dense weights and only the embedding
tables' rows that changed since the previous version, and the manifest
names the full version the chain starts from (``"full"``). Reading a delta
version loads that full version and applies every delta after it, in order
(:func:`load_version`): the weights equal those of a full version of the
same model. Every ``N``-th version is full, and pruning never deletes a full
version that a kept delta needs.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import numpy as np

from sparktf.errors import SparkTFError
from sparktf.models.keras_internals import nested_layers
from sparktf.models.rebuild import register_sparktf_classes
from sparktf.storage import join, local_copy, store_for

__all__ = ["PublishedVersion", "VersionWriter", "published_root", "publish", "newest_version", "versions",
           "prune_versions", "load_version", "read_version"]

#: The folder of the versions inside ``model_dir``.
PUBLISHED = "published"
MODEL_FILE = "model.keras"
DELTA_FILE = "delta.npz"
MANIFEST_FILE = "manifest.json"
_VERSION_RE = re.compile(r"^(\d+)/?$")


@dataclass(frozen=True)
class PublishedVersion:
    """One complete version: its number, folder and manifest."""

    version: int
    path: str
    manifest: Dict[str, Any]

    @property
    def model_path(self) -> str:
        """The version's ``model.keras``."""
        return join(self.path, MODEL_FILE)

    @property
    def full(self) -> int:
        """The full version whose weights this one starts from (itself, for a full version)."""
        return int(self.manifest.get("full", self.version))

    @property
    def files(self) -> List[str]:
        """The files that hold it: ``model.keras``, or ``delta.npz`` for a delta version."""
        return [join(self.path, DELTA_FILE if self.full != self.version else MODEL_FILE)]


def published_root(model_dir: str) -> str:
    """``model_dir/published``."""
    return join(model_dir, PUBLISHED)


def _numbers(root: str) -> List[int]:
    """The numbers of the version folders under ``root`` (complete or not), ascending."""
    store = store_for(root, "model_dir")
    if not store.exists(root):
        return []
    found = (_VERSION_RE.match(os.path.basename(name.rstrip("/"))) for name in store.listdir(root))
    return sorted(int(match.group(1)) for match in found if match)


def versions(model_dir: str) -> List[int]:
    """The numbers of the complete versions (those with a manifest), ascending."""
    root = published_root(model_dir)
    store = store_for(root, "model_dir")
    return [number for number in _numbers(root) if store.exists(join(root, str(number), MANIFEST_FILE))]


def newest_version(model_dir: str) -> Optional[PublishedVersion]:
    """The newest complete version of ``model_dir``, or None when none was published."""
    complete = versions(model_dir)
    return read_version(model_dir, complete[-1]) if complete else None


def read_version(model_dir: str, number: int) -> PublishedVersion:
    """Version ``number`` of ``model_dir`` (complete: its manifest exists)."""
    path = join(published_root(model_dir), str(number))
    manifest = json.loads(store_for(path, "model_dir").read_bytes(join(path, MANIFEST_FILE)).decode("utf-8"))
    return PublishedVersion(number, path, manifest)


def _next_folder(model_dir: str) -> tuple:
    """``(store, number, folder)`` of the next version."""
    root = published_root(model_dir)
    store = store_for(root, "model_dir")
    complete = versions(model_dir)
    number = (complete[-1] if complete else 0) + 1
    path = join(root, str(number))
    store.makedirs(path)
    return store, number, path


def _write_manifest(store: Any, path: str, number: int, manifest: Dict[str, Any]) -> PublishedVersion:
    written = dict(manifest, version=number)
    store.write_bytes(join(path, MANIFEST_FILE), json.dumps(written, sort_keys=True).encode("utf-8"))
    return PublishedVersion(number, path, written)


def io_signature(model: Any) -> Dict[str, Any]:
    """What a version's scorers rely on: the dtype and per-record shape of each of ``model``'s inputs and outputs."""
    def described(tensors: Any) -> List[List[Any]]:
        return [[str(getattr(t.dtype, "name", t.dtype)), list(t.shape[1:])] for t in tensors or []]

    return {"inputs": described(getattr(model, "inputs", None)), "outputs": described(getattr(model, "outputs", None))}


def publish(model: Any, model_dir: str, manifest: Dict[str, Any]) -> PublishedVersion:
    """Write ``model`` as the next version of ``model_dir`` with ``manifest`` (its ``version`` is added).

    Parameters
    ----------
    model : keras.Model
        Saved with ``model.save`` (``.keras``); readers load it uncompiled.
    model_dir : str
        A local path or a URI.
    manifest : dict
        JSON-serializable facts about the version (batch id, time, metrics); its inputs' and outputs' dtypes and
        shapes are added (``signature``: scorers check that every version keeps them).
    """
    store, number, path = _next_folder(model_dir)
    with tempfile.TemporaryDirectory(prefix="sparktf-publish-") as folder, \
            store.atomic_file(join(path, MODEL_FILE)) as local:
        saved = os.path.join(folder, MODEL_FILE)  # Keras takes only a path named .keras
        model.save(saved)
        shutil.copyfile(saved, local)
    return _write_manifest(store, path, number, dict(manifest, signature=io_signature(model)))


def table_indices(model: Any) -> List[int]:
    """The positions in ``model.weights`` of its embedding tables (``keras.layers.Embedding``'s, nested too)."""
    import keras

    positions = {id(variable): index for index, variable in enumerate(model.weights)}
    return sorted(positions[id(layer.embeddings)] for layer in nested_layers(model)
                  if isinstance(layer, keras.layers.Embedding) and id(layer.embeddings) in positions)


class VersionWriter:
    """Publishes a model's versions to ``model_dir``: all full, or with ``full_every=N`` a full one then ``N - 1``
    deltas (the dense weights and the table rows changed since the previous version).

    Parameters
    ----------
    model_dir : str
        A local path or a URI.
    full_every : int, optional
        Every this many versions one is full (None: every one is). A writer's first version is full.
    """

    def __init__(self, model_dir: str, full_every: Optional[int] = None):
        self.model_dir, self.full_every = model_dir, full_every
        self._tables: Optional[Dict[int, np.ndarray]] = None  # the tables at the previous version
        self._previous: Optional[PublishedVersion] = None

    def write(self, model: Any, manifest: Dict[str, Any]) -> PublishedVersion:
        """Publish ``model`` as the next version with ``manifest``."""
        tables = table_indices(model) if self.full_every else []
        weights = model.get_weights()
        previous = self._previous
        if (not tables or self._tables is None or previous is None or self.full_every is None
                or previous.version - previous.full + 1 >= self.full_every):
            version = publish(model, self.model_dir, manifest)
        else:
            version = self._write_delta(weights, tables, dict(manifest, signature=io_signature(model)), previous)
        self._tables = {index: weights[index].copy() for index in tables} if tables else None
        self._previous = version
        return version

    def _write_delta(self, weights: List[np.ndarray], tables: List[int], manifest: Dict[str, Any],
                     previous: PublishedVersion) -> PublishedVersion:
        assert self._tables is not None
        arrays: Dict[str, np.ndarray] = {}
        for index, weight in enumerate(weights):
            if index not in self._tables:
                arrays[f"dense_{index}"] = weight
                continue
            before = self._tables[index]
            changed = np.flatnonzero(np.any((weight != before).reshape(len(weight), -1), axis=1))
            arrays[f"ids_{index}"], arrays[f"rows_{index}"] = changed, weight[changed]
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        store, number, path = _next_folder(self.model_dir)
        if number != previous.version + 1:  # another writer published in between: this one starts a full chain
            store.delete(path, recursive=True)
            self._previous = None
            raise SparkTFError(f"version {number - 1} of {self.model_dir} was not written by this writer "
                               "(another writer publishes there): publish to a model_dir of its own")
        store.write_bytes(join(path, DELTA_FILE), buffer.getvalue())
        return _write_manifest(store, path, number, dict(manifest, full=previous.full, base=previous.version))


def prune_versions(model_dir: str, keep: Optional[int]) -> None:
    """Delete all but the ``keep`` newest complete versions (None keeps all), oldest first; the full version a kept
    delta version starts from, and the deltas between, stay."""
    if keep is None:
        return
    root = published_root(model_dir)
    store = store_for(root, "model_dir")
    complete = versions(model_dir)
    needed = read_version(model_dir, complete[-keep]).full if 0 < keep <= len(complete) else None
    for number in complete[:-keep] if keep > 0 else complete:
        if needed is None or number < needed:
            store.delete(join(root, str(number)), recursive=True)


def load_version(version: PublishedVersion) -> Any:
    """The Keras model of ``version`` (not compiled: for inference).

    Raises
    ------
    SparkTFError
        When the file cannot be loaded, naming it.
    """
    import keras

    register_sparktf_classes()
    try:
        with local_copy(join(_sibling(version, version.full), MODEL_FILE), "published model") as local:
            model = keras.saving.load_model(local, compile=False)
    except (TypeError, ValueError) as exc:
        raise SparkTFError(
            f"cannot load published version {version.version} ({version.model_path}): {exc}. Custom layers must be "
            "importable where it is loaded and registered with keras.saving.register_keras_serializable()"
        ) from exc
    if version.full != version.version:
        _apply_deltas(model, version)
    return model


def _sibling(version: PublishedVersion, number: int) -> str:
    """The folder of version ``number`` beside ``version``'s."""
    return join(version.path.rstrip("/").rsplit("/", 1)[0], str(number))


def _apply_deltas(model: Any, version: PublishedVersion) -> None:
    """Bring ``model`` (``version``'s full version) to ``version`` with the deltas after the full one, in order."""
    weights = model.get_weights()
    for number in range(version.full + 1, version.version + 1):
        path = join(_sibling(version, number), DELTA_FILE)
        try:
            data = store_for(path, "model_dir").read_bytes(path)
        except OSError as exc:
            raise SparkTFError(f"published version {version.version} needs the delta of version {number} "
                               f"({path}), which cannot be read: {exc}") from exc
        with np.load(io.BytesIO(data)) as delta:
            for index in range(len(weights)):
                if f"dense_{index}" in delta:
                    weights[index] = delta[f"dense_{index}"]
                else:
                    weights[index][delta[f"ids_{index}"]] = delta[f"rows_{index}"]
    model.set_weights(weights)
