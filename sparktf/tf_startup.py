"""Keeping TensorFlow's start-up log lines out of the output of the driver and the Python workers.

Importing TensorFlow writes lines to the process's standard error before
``TF_CPP_MIN_LOG_LEVEL`` is read (absl's "before absl::InitializeLog()"
notice, oneDNN, "Could not find cuda drivers", CPU instruction sets), and a
machine without an NVIDIA driver logs "failed call to cuInit" as an error when
the devices are first listed. In a notebook or a terminal these lines come from
the driver and from every Spark Python worker.

``import sparktf`` installs :func:`install`: the first ``import tensorflow``
after it (by ``keras``, sparktf or user code, on the driver or in a Python
worker) runs with file descriptor 2 read by a thread that drops exactly those
lines and passes every other line on unchanged, lists the devices during that
time (in a Spark task: later, inside :func:`quietly`, once the task's
GPUs are chosen, since TensorFlow reads ``CUDA_VISIBLE_DEVICES`` when it
lists them), and leaves
``TF_CPP_MIN_LOG_LEVEL`` at ``1`` (no C++ INFO lines such as
"XLA service ... initialized") unless it is set already. The cuInit error is
dropped only where the machine has no NVIDIA driver. Set
``SPARKTF_SHOW_TF_STARTUP=1`` to see everything.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import threading
from typing import Iterator, List, Tuple

__all__ = ["install", "import_without_devices", "list_devices", "quietly", "StartupLineFilter"]

SHOW_ENV = "SPARKTF_SHOW_TF_STARTUP"

#: Lines TensorFlow writes while it loads on any machine (searched for anywhere in a line).
_ALWAYS = tuple(re.compile(pattern) for pattern in (
    rb"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR\s*$",
    rb"\bport\.cc:\d+\] oneDNN custom operations are on\.",
    rb"\bcpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized to use available CPU instructions",
    rb"^To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags\.\s*$",
))
#: Lines that only say that the machine has no NVIDIA driver.
_NO_DRIVER = re.compile(rb"\bcudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, GPU will not be used\.")
_CUINIT = re.compile(rb"\] failed call to cuInit: ")


class StartupLineFilter:
    """Decides, line by line, which of TensorFlow's start-up lines to drop.

    Parameters
    ----------
    has_nvidia_driver : bool
        Whether the machine has an NVIDIA kernel driver; without one the
        cuInit error is expected and dropped, with one it is kept. A "Could
        not find cuda drivers" line seen before it counts as no driver too.
    """

    def __init__(self, has_nvidia_driver: bool) -> None:
        self._no_driver = not has_nvidia_driver

    def keep(self, line: bytes) -> bool:
        """True when ``line`` (bytes, with or without its newline) is to be written out."""
        if _NO_DRIVER.search(line):
            self._no_driver = True
            return False
        if _CUINIT.search(line):
            return not self._no_driver
        return not any(pattern.search(line) for pattern in _ALWAYS)


def install() -> None:
    """Make the process's first ``import tensorflow`` quiet (once; not when TensorFlow is loaded already).

    Does nothing when ``SPARKTF_SHOW_TF_STARTUP`` is set to anything but
    ``0`` or an empty string.
    """
    if _showing_everything() or "tensorflow" in sys.modules:
        return
    if not any(isinstance(finder, _QuietTensorFlowFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietTensorFlowFinder())


def import_without_devices() -> None:
    """Import TensorFlow and Keras now, quietly, without listing devices (so no runtime starts).

    For a process that forks Spark's Python workers: each task lists the
    devices later, once its own are chosen. Does nothing more than the imports
    when TensorFlow is loaded already.
    """
    for finder in [finder for finder in sys.meta_path if isinstance(finder, _QuietTensorFlowFinder)]:
        sys.meta_path.remove(finder)
    with quietly():
        import keras  # noqa: F401
        import tensorflow  # noqa: F401


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` through the other finders and wraps its loader in a :class:`_QuietLoader`."""

    def __init__(self) -> None:
        self._finding = False

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 - the finder protocol
        if fullname != "tensorflow" or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)  # one import only
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    """Runs TensorFlow's own loader with the start-up lines filtered, then hands the module back to it."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec):  # noqa: D102 - the loader protocol
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: D102 - the loader protocol
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        with _filtered_stderr():
            self._loader.exec_module(module)
            if not _in_spark_task():
                _list_devices(module)


def _showing_everything() -> bool:
    """Whether ``SPARKTF_SHOW_TF_STARTUP`` asks for every line (set to anything but ``0`` or empty)."""
    return os.environ.get(SHOW_ENV, "0") not in ("", "0")


def _in_spark_task() -> bool:
    taskcontext = sys.modules.get("pyspark.taskcontext")
    return taskcontext is not None and taskcontext.TaskContext.get() is not None


def _list_devices(tensorflow) -> None:
    try:
        tensorflow.config.list_physical_devices()  # where the cuInit error is logged
    except Exception:  # noqa: BLE001 - TensorFlow raises it again where devices are used
        pass


def list_devices() -> None:
    """Have TensorFlow list its devices now (call it inside :func:`quietly`)."""
    import tensorflow

    _list_devices(tensorflow)


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """TensorFlow's start-up lines filtered out of standard error inside the block, as in :func:`install`.

    Spark tasks start TensorFlow's runtime in it once their ``CUDA_VISIBLE_DEVICES``
    is set: setting its threads can already start the CUDA platform (the
    cuInit error), listing the devices does. Nothing is filtered when
    ``SPARKTF_SHOW_TF_STARTUP`` asks for everything.
    """
    if _showing_everything():
        yield
        return
    with _filtered_stderr():
        yield


@contextlib.contextmanager
def _filtered_stderr() -> Iterator[None]:
    """Route file descriptor 2 through a :class:`StartupLineFilter` for the duration of the block."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    try:
        original = os.dup(2)
        read_end, write_end = os.pipe()
    except OSError:  # no usable standard error: nothing to filter
        yield
        return
    os.dup2(write_end, 2)
    os.close(write_end)
    keep = StartupLineFilter(has_nvidia_driver=os.path.exists("/proc/driver/nvidia")).keep
    forwarder = threading.Thread(target=_forward, args=(read_end, original, keep), daemon=True,
                                 name="sparktf-tf-startup-log")
    forwarder.start()
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(original, 2)  # the pipe's last write end in this process: the forwarder reads to its end
        forwarder.join(timeout=5.0)  # a child process started meanwhile may hold the pipe open longer


def _forward(read_end: int, out: int, keep) -> None:
    """Copy the lines read from ``read_end`` that ``keep`` accepts to ``out``, then close both."""
    pending = b""
    try:
        while True:
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            lines, pending = _split(pending + chunk)
            _write(out, b"".join(line for line in lines if keep(line)))
        if pending and keep(pending):
            _write(out, pending)
    finally:
        os.close(read_end)
        os.close(out)


def _split(data: bytes) -> Tuple[List[bytes], bytes]:
    """Complete lines (with their newlines) and the unfinished rest."""
    end = data.rfind(b"\n") + 1
    return data[:end].splitlines(keepends=True), data[end:]


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except OSError:  # standard error went away: drop what is left
            return
        view = view[written:]
