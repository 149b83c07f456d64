"""The message of a failed child: its role, how it ended, and its last traceback or output lines.

The task sends it to the driver over the log stream (``LogClient.report_failure``),
and the driver raises it.
"""

from __future__ import annotations

import re
import signal
from typing import Optional, Sequence

__all__ = ["failure_message", "exception_line"]

MAX_TRACEBACK_LINES = 100
LINES_WITHOUT_TRACEBACK = 40
MAX_LINE_CHARS = 500
_TRACEBACK_START = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(: .*)?$")


def exception_line(output: Sequence[str]) -> Optional[str]:
    """The ``ExceptionType: message`` line of the last Python traceback in ``output``, if any."""
    starts = [i for i, line in enumerate(output) if line.startswith(_TRACEBACK_START)]
    if not starts:
        return None
    for line in reversed(output[starts[-1] + 1:]):
        if _EXCEPTION_LINE.match(line):
            return line
    return None


def _exit_description(exit_code: int) -> str:
    if exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exit code {exit_code}"


def failure_message(role: str, exit_code: Optional[int], output: Sequence[str], reason: Optional[str] = None) -> str:
    """The error text of a failed child.

    Parameters
    ----------
    role : str
        E.g. ``"worker 1"``.
    exit_code : int or None
        The child's exit code (negative: killed by that signal), None if it
        did not exit by itself.
    output : sequence of str
        The last lines the child wrote (stdout and stderr).
    reason : str, optional
        Why the task gave up on the child (e.g. a timeout), if not its exit.

    Returns
    -------
    str
        A headline naming the role, the exit and the exception line, then the
        last traceback (at most 100 lines) or, without one, the last 40 lines.
    """
    what = reason or _exit_description(exit_code if exit_code is not None else -signal.SIGKILL)
    error_line = exception_line(output)
    headline = f"sparktf.run: {role} failed ({what})" + (f": {error_line}" if error_line else "")
    starts = [i for i, line in enumerate(output) if line.startswith(_TRACEBACK_START)]
    if starts:
        shown = list(output[starts[-1]:])[-MAX_TRACEBACK_LINES:]
    else:
        shown = list(output[-LINES_WITHOUT_TRACEBACK:])
    if not shown:
        return headline + f"\n(the {role} process wrote no output)"
    shown = [line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS] + " [...]" for line in shown]
    return "\n".join([headline, f"--- last {len(shown)} lines of {role}'s output ---", *shown])

