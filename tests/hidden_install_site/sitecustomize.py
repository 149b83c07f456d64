"""Simulates executors on which sparktf is not installed.

Put this folder on ``PYTHONPATH``: every Python process then finds ``sparktf``
only inside a shipped zip (``SparkContext.addPyFile``), never in the
virtualenv's own installation. A driver calls :func:`reveal_installed` to
import its own copy.
"""

import importlib.machinery
import sys


class _ZipOnlySparktfFinder:
    """Finds the ``sparktf`` package only in zip files on ``sys.path``."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "sparktf":
            return None
        zips = [entry for entry in sys.path if entry.endswith(".zip")]
        spec = importlib.machinery.PathFinder.find_spec(name, zips)
        if spec is None:
            raise ModuleNotFoundError("No module named 'sparktf' (hidden installation)", name=name)
        return spec


sys.meta_path.insert(0, _ZipOnlySparktfFinder)


def reveal_installed():
    """Let this process import the installed sparktf again."""
    sys.meta_path.remove(_ZipOnlySparktfFinder)
