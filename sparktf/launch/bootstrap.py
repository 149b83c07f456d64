"""Entry point of the child process: ``python -m sparktf.launch.bootstrap PROGRAM RESULT DONE RELEASE WATCH_FD``.

``PROGRAM`` holds the pickled ``(RunContext, cloudpickled (main_fun, args))``;
the return value of ``main_fun`` is cloudpickled into ``RESULT`` by rank 0
only (other ranks may return anything, picklable or not). ``WATCH_FD`` is the
read end of the task's pipe: end-of-file there means the task is gone, and the
child kills its whole process group.

A child whose ``main_fun`` returned creates the file ``DONE`` and stays up
until the file ``RELEASE`` exists: the task creates it once every rank's
``main_fun`` returned. A rank that left at once would take its TensorFlow
server with it while a peer still pulls the last collective's buffers from
it (``UnavailableError: ... Connection reset by peer`` on that peer).

The child ends with ``os._exit`` after flushing: TensorFlow's collective
threads can otherwise keep a finished process from exiting.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback

import cloudpickle

MAX_RESULT_BYTES = 32 * 1024 * 1024
#: Seconds a child whose program returned waits for the other ranks' programs before it exits anyway.
RELEASE_WAIT_S = 600.0
_RELEASE_POLL_S = 0.02


def _die_with_parent(watch_fd: int) -> None:
    """Block until the task closes its end of the pipe, then kill this process group."""
    while True:
        try:
            if not os.read(watch_fd, 1):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _run(program_path: str, result_path: str) -> None:
    with open(program_path, "rb") as file:
        ctx, program = pickle.load(file)
    main_fun, args = cloudpickle.loads(program)
    result = main_fun(args, ctx)
    if ctx.worker_num == 0:
        data = cloudpickle.dumps(result)
        if len(data) > MAX_RESULT_BYTES:
            raise ValueError(
                f"main_fun's return value is {len(data)} bytes pickled, more than sparktf.run brings back "
                f"({MAX_RESULT_BYTES}); write large results to files and return their paths"
            )
        with open(result_path, "wb") as file:
            file.write(data)


def _stay_until_released(done_path: str, release_path: str) -> None:
    """Say this rank's program returned, then wait (bounded) until every rank's has."""
    open(done_path, "w").close()
    deadline = time.monotonic() + RELEASE_WAIT_S
    while not os.path.exists(release_path) and time.monotonic() < deadline:
        time.sleep(_RELEASE_POLL_S)


def main(argv: list) -> int:
    """Run the program of ``argv`` = [program, result, done, release, watch_fd] (paths); return the exit code."""
    program_path, result_path, done_path, release_path, watch_fd = argv
    threading.Thread(target=_die_with_parent, args=(int(watch_fd),), name="sparktf-run-watch", daemon=True).start()
    exit_code = _exit_code(program_path, result_path)
    if exit_code == 0:
        _stay_until_released(done_path, release_path)
    return exit_code


def _exit_code(program_path: str, result_path: str) -> int:
    try:
        _run(program_path, result_path)
        return 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    exit_code = main(sys.argv[1:])
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
