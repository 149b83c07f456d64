"""Pickling ``main_fun`` and ``args`` for a child process on an executor."""

from __future__ import annotations

import os
import sys
import sysconfig
import types
from typing import Any, Callable

import cloudpickle

__all__ = ["pickle_program"]


def _installed(module: types.ModuleType) -> bool:
    """Whether ``module`` comes with the Python installation or an installed package."""
    path = getattr(module, "__file__", None)
    if path is None:
        return True
    path = os.path.realpath(path)
    roots = {sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(path.startswith(os.path.realpath(root) + os.sep) for root in roots)


def pickle_program(main_fun: Callable[[Any, Any], Any], args: Any) -> bytes:
    """``cloudpickle`` bytes of ``(main_fun, args)`` that a fresh Python on an executor can load.

    A function from ``__main__`` is pickled by value by cloudpickle anyway.
    One from any other module that is not part of an installed package (a
    test module, a script's helper module next to it) is pickled by value as
    well, with the module's functions and classes it uses: executors need not
    be able to import that module. Functions of installed packages are pickled
    by reference, as usual.

    Raises
    ------
    TypeError
        ``main_fun`` or ``args`` cannot be pickled.
    """
    module = sys.modules.get(getattr(main_fun, "__module__", None) or "")
    by_value = module is not None and module.__name__ != "__main__" and not _installed(module)
    if by_value:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps((main_fun, args))
    except Exception as error:
        raise TypeError(
            f"sparktf.run cannot pickle main_fun {main_fun!r} with its args for the executors: {error}. "
            "Pass args that pickle (numbers, strings, argparse.Namespace, dicts) and create "
            "sessions, clients and open files inside main_fun."
        ) from error
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(module)
