"""The file map of docs/internals.md: every module of the package has a row, and every row names a module.

As ``test_layering.py`` holds the imports to the map's layers, this holds the map to the files: a module added
without its row, or a row left behind by a module that moved, fails here.
"""

import pathlib
import re

import sparktf

ROOT = pathlib.Path(sparktf.__file__).parent
MAP = ROOT.parent / "docs" / "internals.md"


def mapped_paths():
    """The ``.py`` paths the map's table rows name (a row may name several, as `a.py`, `b.py`)."""
    paths = set()
    for line in MAP.read_text().splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            paths.update(re.findall(r"`([\w/]+\.py)`", first_cell))
    return paths


def package_paths():
    """Every module of the package, as the map writes it (relative to ``sparktf/``), ``__init__.py`` files aside."""
    return {str(path.relative_to(ROOT)) for path in ROOT.rglob("*.py") if path.name != "__init__.py"}


def test_every_module_has_a_row_in_the_internals_map():
    missing = sorted(package_paths() - mapped_paths())
    assert not missing, f"modules without a row in docs/internals.md: {missing}"


def test_every_row_of_the_internals_map_names_a_module():
    stale = sorted(mapped_paths() - package_paths())
    assert not stale, f"rows of docs/internals.md naming no module: {stale}"
