"""A local S3 store for benchmarks: moto's server in a process of its own, behind the tests' TCP proxy.

The server runs apart so that its CPU time can be read (``/proc/<pid>``);
the proxy (``tests/flaky_proxy.py``, on a thread of this process) passes
everything on, or models a distant store: :meth:`LocalS3.distant` holds each
request ``DELAY_SECONDS`` and caps each connection at ``BYTES_PER_SECOND``,
as S3 behaves from a cloud VM.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Tuple

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from flaky_proxy import FlakyProxy  # noqa: E402

#: What the distant store adds to each request, and what one connection carries at most.
DELAY_SECONDS, BYTES_PER_SECOND = 0.020, 100e6
_SERVER = """
import logging, sys
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.ERROR)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print("http://%s:%d" % server.get_host_and_port(), flush=True)
sys.stdin.read()
server.stop()
"""
STOP_SECONDS = 30


class LocalS3:
    """``with LocalS3() as store: ... store.url`` (the proxy's); ``store.distant(True)`` adds the latency."""

    def __init__(self) -> None:
        self._server = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.server_url = self._server.stdout.readline().strip()
        self._proxy = FlakyProxy(self.server_url)
        self.url = ""

    def __enter__(self) -> "LocalS3":
        self.url = self._proxy.__enter__().url
        return self

    def __exit__(self, *exc) -> None:
        self._proxy.__exit__(*exc)
        self._server.stdin.close()
        try:
            self._server.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait(STOP_SECONDS)

    def distant(self, on: bool) -> None:
        """Model a distant store (``DELAY_SECONDS`` a request, ``BYTES_PER_SECOND`` a connection), or pass through."""
        self._proxy.delay_seconds = DELAY_SECONDS if on else 0.0
        self._proxy.bytes_per_second = BYTES_PER_SECOND if on else None

    def cpu_seconds(self) -> Tuple[float, float]:
        """CPU seconds so far of the S3 server's process and of the proxy's thread."""
        server = psutil.Process(self._server.pid).cpu_times()
        proxy = next((thread for thread in psutil.Process().threads() if thread.id == self._proxy.native_id), None)
        return server.user + server.system, 0.0 if proxy is None else proxy.user_time + proxy.system_time
