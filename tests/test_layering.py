"""The package's layers: a module imports only from lower layers (or its own subpackage).

The map is the one in docs/internals.md. A new module or subpackage must be
placed in it, so the test also fails for a module it does not know.
"""

import ast
import pathlib

import sparktf

ROOT = pathlib.Path(sparktf.__file__).parent

# Lower numbers are lower layers. Units in one layer do not import each other,
# except the public modules (layer 6), which build on one another. sparktf.ml,
# the Spark ML stages, is a public layer on top of them. Training has layers of
# its own inside layer 5: the state both sides share (sparktf.training), the
# tables' strategies, the worker's side, the driver's side (it starts the
# worker's loop in its jobs). Fractional layers order a package's own parts and
# never let them import a sibling package of the same whole layer.
LAYERS = {
    "sparktf.errors": -1,  # below every layer: a foundation module may raise sparktf's errors
    "sparktf.triggers": 0,
    "sparktf.context": 3,
    "sparktf.tf_startup": 0,
    "sparktf.optimizers": 0,
    "sparktf.layers": 0,
    "sparktf.process_state": 0,
    "sparktf.spark": 2,
    "sparktf.collective": 1,
    "sparktf.storage": 1,
    "sparktf.data": 3,
    "sparktf.models": 4,
    "sparktf.training": 5,
    "sparktf.training.tables": 5.1,
    "sparktf.training.worker": 5.2,
    "sparktf.training.driver": 5.3,
    "sparktf.inference": 5,
    "sparktf.launch": 5,
    "sparktf": 6,
    "sparktf.dataset": 6,
    "sparktf.optimizer": 6,
    "sparktf.predictor": 6,
    "sparktf.net": 6,
    "sparktf.summary": 6,
    "sparktf.streaming": 6,
    "sparktf.ml": 7,
}
PUBLIC_LAYER = 6


def unit_of(module: str) -> str:
    """The entry of LAYERS a module belongs to: its subpackage, or itself."""
    parts = module.split(".")
    for size in range(len(parts), 0, -1):
        name = ".".join(parts[:size])
        if name in LAYERS:
            return name
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/internals.md")


def _family(unit: str) -> str:
    """The package a unit's fractional layer belongs to: ``sparktf.training`` for ``sparktf.training.worker``."""
    return ".".join(unit.split(".")[:2])


def module_name(path: pathlib.Path) -> str:
    relative = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(relative.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sparktf_imports(source: str, importer: str, is_package: bool):
    """(line, imported module) for every import of a sparktf module in ``source``, nested ones included."""
    package = importer if is_package else importer.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parents = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parents + ([base] if base else []))
            # `from sparktf.data import specs` imports the module sparktf.data.specs
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in ALL_MODULES else base for alias in node.names]
        else:
            continue
        for name in names:
            if name == "sparktf" or name.startswith("sparktf."):
                yield node.lineno, name


def violations(source: str, importer: str, is_package: bool = False):
    """The imports in ``source`` (the text of module ``importer``) that go up or sideways."""
    found = []
    source_unit = unit_of(importer)
    for line, imported in sparktf_imports(source, importer, is_package):
        target_unit = unit_of(imported)
        source_layer, target_layer = LAYERS[source_unit], LAYERS[target_unit]
        if target_unit == source_unit or source_layer == target_layer == PUBLIC_LAYER:
            continue
        same_family = _family(target_unit) == _family(source_unit)
        if int(target_layer) < int(source_layer) or (target_layer < source_layer and same_family):
            continue
        found.append(f"line {line}: {importer} (layer {source_layer}) imports {imported} (layer {target_layer})")
    return found


ALL_MODULES = {module_name(p) for p in ROOT.rglob("*.py")}


def test_every_module_has_a_layer():
    for module in sorted(ALL_MODULES):
        unit_of(module)


def test_imports_only_go_down():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        found += violations(path.read_text(), module_name(path), path.name == "__init__.py")
    assert not found, "imports that go up or sideways:\n" + "\n".join(found)


def test_the_checker_flags_upward_and_sideways_imports():
    source = "from sparktf.training.worker.loop import run_segment\n\ndef f():\n    from sparktf.collective import Communicator\n"
    assert [v.split(":")[0] for v in violations(source, "sparktf.data.batching")] == ["line 1"]
    assert len(violations("from sparktf.inference import feeds\n", "sparktf.training.worker.loop")) == 1
    assert violations("from sparktf.data import specs\nfrom . import step\n", "sparktf.training.worker.loop") == []
    assert violations("from sparktf.dataset import TFDataset\n", "sparktf.net") == []
    assert len(violations("from ...optimizer import TFOptimizer\n", "sparktf.training.worker.loop")) == 1
