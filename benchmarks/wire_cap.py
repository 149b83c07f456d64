"""A rate-capped wire between two network namespaces, for benchmarks that must not be CPU-bound.

``capped_wire(mbit)`` creates two private network namespaces joined by a
veth pair with addresses ``10.213.0.1`` and ``10.213.0.2``, and caps each
end's egress at ``mbit`` megabits per second with a token-bucket filter
(``tc qdisc ... tbf``), so each direction of the pair is a link of that
rate. Nothing else is connected to them: traffic between the namespaces
cannot leave the machine, and the real interfaces and ``lo`` are never
touched. A process joins one with ``enter_namespace`` before it opens
sockets. Needs root and iproute2's ``ip`` and ``tc`` (``unavailable`` says
why not).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
from typing import Iterator

__all__ = ["HOSTS", "capped_wire", "enter_namespace", "unavailable"]

HOSTS = ("10.213.0.1", "10.213.0.2")
_PREFIX = 30
_BURST = "256kb"  # above the largest (GSO) packet, which a smaller bucket would drop
_QUEUE_LATENCY = "20ms"
_CLONE_NEWNET = 0x40000000
_COMMAND_SECONDS = 30


def unavailable() -> str | None:
    """Why ``capped_wire`` cannot run here, or None if it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    return f"needs iproute2 ({', '.join(missing)} not found)" if missing else None


@contextlib.contextmanager
def capped_wire(mbit: float) -> Iterator[tuple[str, str]]:
    """Yield the names of two new namespaces joined by a veth pair capped at ``mbit`` Mbit/s each way.

    The namespace named first holds ``HOSTS[0]``, the other ``HOSTS[1]``;
    both are deleted (with the pair) on exit.
    """
    tag = os.getpid()
    namespaces = (f"sparktf-wire-{tag}-a", f"sparktf-wire-{tag}-b")
    devices = (f"stf{tag}a", f"stf{tag}b")
    created = []
    try:
        for namespace in namespaces:
            _ip("netns", "add", namespace)
            created.append(namespace)
        _ip("link", "add", devices[0], "netns", namespaces[0], "type", "veth",
            "peer", "name", devices[1], "netns", namespaces[1])
        for namespace, device, host in zip(namespaces, devices, HOSTS):
            _ip("-n", namespace, "addr", "add", f"{host}/{_PREFIX}", "dev", device)
            _ip("-n", namespace, "link", "set", device, "up")
            _run("tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf",
                 "rate", f"{mbit:g}mbit", "burst", _BURST, "latency", _QUEUE_LATENCY)
        yield namespaces
    finally:
        for namespace in created:
            _ip("netns", "delete", namespace)


def enter_namespace(name: str) -> None:
    """Move the calling thread (and the threads and sockets it creates later) into namespace ``name``."""
    with open(f"/run/netns/{name}") as handle:
        if hasattr(os, "setns"):  # Python 3.12+
            os.setns(handle.fileno(), os.CLONE_NEWNET)
            return
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(handle.fileno(), _CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into network namespace {name!r}: {os.strerror(error)}")


def _ip(*arguments: str) -> None:
    _run("ip", *arguments)


def _run(*command: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, timeout=_COMMAND_SECONDS)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}")
