"""Published model versions: ``<model_dir>/published/<version>/`` with ``model.keras`` and ``manifest.json``.

A streaming ``TFOptimizer.optimize_stream`` publishes; ``TFPredictor.from_published``
scores with the newest version. A version exists for readers once its
manifest does: the writer uploads ``model.keras`` first (complete or not at
all, through :mod:`sparktf.storage`), then the manifest, so a reader never
sees a partial version on a local disk or an object store alike. Versions
are numbered 1, 2, ... in the order they are published; a folder that a
writer killed mid-way left without a manifest is reused by the next version
of its number.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from sparktf.errors import SparkTFError
from sparktf.storage import join, local_copy, store_for

__all__ = ["PublishedVersion", "published_root", "publish", "newest_version", "versions", "prune_versions",
           "load_version"]

#: The folder of the versions inside ``model_dir``.
PUBLISHED = "published"
MODEL_FILE = "model.keras"
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
    if not complete:
        return None
    path = join(published_root(model_dir), str(complete[-1]))
    manifest = json.loads(store_for(path, "model_dir").read_bytes(join(path, MANIFEST_FILE)).decode("utf-8"))
    return PublishedVersion(complete[-1], path, manifest)


def publish(model: Any, model_dir: str, manifest: Dict[str, Any]) -> PublishedVersion:
    """Write ``model`` as the next version of ``model_dir`` with ``manifest`` (its ``version`` is added).

    Parameters
    ----------
    model : keras.Model
        Saved with ``model.save`` (``.keras``); readers load it uncompiled.
    model_dir : str
        A local path or a URI.
    manifest : dict
        JSON-serializable facts about the version (batch id, time, metrics).
    """
    root = published_root(model_dir)
    store = store_for(root, "model_dir")
    complete = versions(model_dir)
    number = (complete[-1] if complete else 0) + 1
    path = join(root, str(number))
    store.makedirs(path)
    with tempfile.TemporaryDirectory(prefix="sparktf-publish-") as folder, \
            store.atomic_file(join(path, MODEL_FILE)) as local:
        saved = os.path.join(folder, MODEL_FILE)  # Keras takes only a path named .keras
        model.save(saved)
        shutil.copyfile(saved, local)
    written = dict(manifest, version=number)
    store.write_bytes(join(path, MANIFEST_FILE), json.dumps(written, sort_keys=True).encode("utf-8"))
    return PublishedVersion(number, path, written)


def prune_versions(model_dir: str, keep: Optional[int]) -> None:
    """Delete all but the ``keep`` newest complete versions (None keeps all), oldest first."""
    if keep is None:
        return
    root = published_root(model_dir)
    store = store_for(root, "model_dir")
    complete = versions(model_dir)
    for number in complete[:-keep] if keep > 0 else complete:
        store.delete(join(root, str(number)), recursive=True)


def load_version(version: PublishedVersion) -> Any:
    """The Keras model of ``version`` (not compiled: for inference).

    Raises
    ------
    SparkTFError
        When the file cannot be loaded, naming it.
    """
    import keras

    try:
        with local_copy(version.model_path, "published model") as local:
            return keras.saving.load_model(local, compile=False)
    except (TypeError, ValueError) as exc:
        raise SparkTFError(
            f"cannot load published version {version.version} ({version.model_path}): {exc}. Custom layers must be "
            "importable where it is loaded and registered with keras.saving.register_keras_serializable()"
        ) from exc
