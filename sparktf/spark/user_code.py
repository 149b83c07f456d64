"""User code pickled by value, so executors need not have it installed.

Classes and functions defined in ``__main__``, a notebook, or a module the
executors cannot import (a test module, a script beside the driver) travel as
code inside the pickle (cloudpickle's by-value mode) instead of as a reference
to a module the executor lacks.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import threading
import types
from typing import Any, Dict, Iterable, Iterator, List

import cloudpickle

__all__ = ["pickle_by_value"]


def pickle_by_value(objects: Dict[str, Any]) -> bytes:
    """cloudpickle the dict ``objects``, taking the user's own modules by value.

    Classes and functions defined in ``__main__``, a notebook or a module the
    executors cannot import (a test module, a script beside the driver) travel
    as code, so executors need not have them installed; so do the classes
    they derive from in such modules.
    """
    modules = {module for obj in objects.values() for module in _defining_modules(obj)}
    with _registered_by_value(m for m in modules if _ships_by_value(m)):
        return cloudpickle.dumps(objects)


def _defining_modules(obj: Any) -> Iterator[types.ModuleType]:
    """The modules defining ``obj`` and, for a class, every class it derives from (a user's base layer
    in a helper module beside the notebook travels too)."""
    for item in obj.__mro__ if isinstance(obj, type) else (obj,):
        name = getattr(item, "__module__", None)
        if name in sys.modules:
            yield sys.modules[name]


#: Modules this process registered with cloudpickle's (process-wide) by-value registry, with the number of
#: pickles in flight that need them: concurrent calls from threads register and unregister a module once.
_REGISTERED: Dict[str, int] = {}
_REGISTRY_LOCK = threading.Lock()


@contextlib.contextmanager
def _registered_by_value(modules: Iterable[types.ModuleType]) -> Iterator[None]:
    added = []
    with _REGISTRY_LOCK:
        already = set(cloudpickle.list_registry_pickle_by_value())
        for module in modules:
            name = module.__name__
            if name in _REGISTERED:
                _REGISTERED[name] += 1
            elif name not in already:  # registered by the user: theirs to keep
                cloudpickle.register_pickle_by_value(module)
                _REGISTERED[name] = 1
            else:
                continue
            added.append(module)
    try:
        yield
    finally:
        with _REGISTRY_LOCK:
            for module in added:
                _REGISTERED[module.__name__] -= 1
                if not _REGISTERED[module.__name__]:
                    del _REGISTERED[module.__name__]
                    cloudpickle.unregister_pickle_by_value(module)


def _ships_by_value(module: types.ModuleType) -> bool:
    """True for the user's own code: not ``__main__`` (cloudpickle already
    takes it by value), not sparktf (shipped to executors), not installed."""
    name = module.__name__
    if name == "__main__" or name.split(".", 1)[0] == "sparktf":
        return False
    path = getattr(module, "__file__", None)
    if path is None:
        return False
    path = os.path.realpath(path)
    return not any(path.startswith(root + os.sep) for root in _installed_roots())


def _installed_roots() -> List[str]:
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    paths = sysconfig.get_paths()
    return sorted({os.path.realpath(paths[k]) for k in keys if k in paths})
