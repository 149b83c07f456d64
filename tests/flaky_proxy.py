"""A TCP proxy on 127.0.0.1 in front of a server (moto's S3), that resets the connections a rule picks.

A flaky store as the tests model it: ``reset_all`` resets every new
connection at once (a store that is gone); ``reset_when(chunk)`` resets a
connection (both ends, RST) when a chunk the client sends makes it true (one
request of one object). It counts connections and resets, and runs an asyncio
loop on a thread of its own.
"""

import asyncio
import socket
import struct
import threading
from typing import Callable, Optional
from urllib.parse import urlparse

START_SECONDS = 10


class FlakyProxy:
    """``with FlakyProxy("http://127.0.0.1:5000") as proxy: ... proxy.url``."""

    def __init__(self, target_url: str):
        parsed = urlparse(target_url)
        self.target = (parsed.hostname, parsed.port)
        self.reset_all = False
        self.reset_when: Optional[Callable[[bytes], bool]] = None
        self.connections = 0
        self.resets = 0
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="flaky-proxy", daemon=True)

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
        try:
            while chunk := await reader.read(65536):
                rule = self.reset_when
                if inspect and rule is not None and rule(chunk):
                    self._reset(*writers)
                    return
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
