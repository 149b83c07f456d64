"""A TCP proxy on 127.0.0.1 in front of a server (moto's S3), that resets the connections a rule picks.

A flaky store as the tests model it: ``reset_all`` resets every new
connection at once (a store that is gone); ``reset_when(chunk)`` resets a
connection (both ends, RST) when a chunk the client sends makes it true (one
request of one object). A distant store as the benchmarks model it:
``delay_seconds`` holds each request that long before passing it on, and
``bytes_per_second`` caps what each connection passes back. It counts
connections and resets, and runs an asyncio loop on a thread of its own
(``native_id``: its thread's id, whose CPU time a benchmark reads).
"""

import asyncio
import socket
import struct
import threading
import time
from typing import Callable, Optional
from urllib.parse import urlparse

START_SECONDS = 10
# How an HTTP request starts: a chunk the client sends that starts with one of these begins a request.
_METHODS = (b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")
# A capped connection runs up this much time ahead of its rate before it pauses.
_LEAST_PAUSE_SECONDS = 0.005


class FlakyProxy:
    """``with FlakyProxy("http://127.0.0.1:5000") as proxy: ... proxy.url``."""

    def __init__(self, target_url: str):
        parsed = urlparse(target_url)
        self.target = (parsed.hostname, parsed.port)
        self.reset_all = False
        self.reset_when: Optional[Callable[[bytes], bool]] = None
        self.delay_seconds = 0.0
        self.bytes_per_second: Optional[float] = None
        self.connections = 0
        self.resets = 0
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="flaky-proxy", daemon=True)

    @property
    def native_id(self) -> Optional[int]:
        """The id of the proxy's thread (``/proc/self/task/<id>``)."""
        return self._thread.native_id

    def __enter__(self) -> "FlakyProxy":
        self._thread.start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0), self._loop).result(START_SECONDS)
        self._server = server
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._shut_down(), self._loop).result(START_SECONDS)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(START_SECONDS)
        self._loop.close()

    async def _shut_down(self) -> None:
        """Stop listening, and end the connections still open."""
        self._server.close()
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def _serve(self, client_reader, client_writer) -> None:
        self.connections += 1
        if self.reset_all:
            self._reset(client_writer)
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            self._reset(client_writer)
            return
        writers = (client_writer, server_writer)
        await asyncio.gather(self._pump(client_reader, server_writer, writers, inspect=True),
                             self._pump(server_reader, client_writer, writers, inspect=False))

    async def _pump(self, reader, writer, writers, inspect: bool) -> None:
        """Pass what ``reader`` reads to ``writer``: requests (``inspect``) through the rules, answers capped."""
        free_at = time.monotonic()  # when the capped connection may pass its next bytes
        try:
            while chunk := await reader.read(65536):
                rule = self.reset_when
                if inspect and rule is not None and rule(chunk):
                    self._reset(*writers)
                    return
                if inspect and self.delay_seconds and chunk.startswith(_METHODS):
                    await asyncio.sleep(self.delay_seconds)
                if not inspect and self.bytes_per_second:
                    free_at = max(free_at, time.monotonic()) + len(chunk) / self.bytes_per_second
                    if free_at - time.monotonic() > _LEAST_PAUSE_SECONDS:  # the loop's timers round up to 1 ms
                        await asyncio.sleep(free_at - time.monotonic())
                writer.write(chunk)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def _reset(self, *writers) -> None:
        self.resets += 1
        for writer in writers:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
