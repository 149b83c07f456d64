"""The task's child process: a fresh Python that runs ``main_fun`` and dies with its task.

- ``sys.executable -m sparktf.launch.bootstrap`` in a new session (its own
  process group), so the task can kill it and everything it started at once.
- The read end of a pipe whose write end only the task holds: when the task
  ends in any way, SIGKILL of its Python worker included, the child reads
  end-of-file and kills its own process group (see ``bootstrap``). No orphans.
- stdout and stderr in one pipe, read line by line as they are written:
  each line goes to the driver prefixed with the role, and the last 100 are
  kept for the error message.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
from typing import Deque, Mapping, Optional, Sequence

from sparktf.launch.logstream import MAX_LINE_BYTES, LogClient

__all__ = ["ChildProcess", "TAIL_LINES"]

TAIL_LINES = 100
_READER_JOIN_S = 10.0
_REAP_S = 10.0


class ChildProcess:
    """Start ``python -m sparktf.launch.bootstrap *arguments`` for one task.

    Parameters
    ----------
    arguments : sequence of str
        Arguments of the bootstrap module, before the watch descriptor.
    env : mapping
        The child's whole environment.
    role : str
        E.g. ``"worker 1"``: the prefix of its lines on the driver.
    log : LogClient
        Where its lines go.
    """

    def __init__(self, arguments: Sequence[str], env: Mapping[str, str], role: str, log: LogClient) -> None:
        self.role = role
        self.tail: Deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._log = log
        watch_read, self._watch_write = os.pipe()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sparktf.launch.bootstrap", *arguments, str(watch_read)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(env),
                pass_fds=(watch_read,),
                start_new_session=True,
            )
        except BaseException:
            os.close(self._watch_write)
            raise
        finally:
            os.close(watch_read)
        self._reader = threading.Thread(target=self._forward_output, name=f"sparktf-run-{role}", daemon=True)
        self._reader.start()

    def _forward_output(self) -> None:
        for raw in iter(lambda: self.process.stdout.readline(MAX_LINE_BYTES), b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.tail.append(line)
            self._log.send(f"[{self.role}] {line}")

    def wait(self, timeout: Optional[float]) -> Optional[int]:
        """The child's exit code once it exits, or None if it is still running after ``timeout`` seconds."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the child's process group (the child and whatever it started)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def close(self) -> None:
        """Kill what is left of the process group, reap the child and stop reading its output (bounded)."""
        self.kill()
        try:
            self.process.wait(timeout=_REAP_S)
        except subprocess.TimeoutExpired:
            pass
        self._reader.join(timeout=_READER_JOIN_S)
        os.close(self._watch_write)
        self.process.stdout.close()
