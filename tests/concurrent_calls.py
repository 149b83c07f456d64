"""Calls run in threads of the test's driver: the tests of concurrent sparktf calls share this."""

from __future__ import annotations

import threading


def in_threads(functions):
    """Start ``{name: function}`` each in a thread named ``name``; return the threads and ``{name: result or error}``."""
    outcomes = {}

    def run(name, function):
        try:
            outcomes[name] = function()
        except Exception as error:  # the test looks at it
            outcomes[name] = error

    threads = [threading.Thread(target=run, args=item, name=item[0]) for item in functions.items()]
    for thread in threads:
        thread.start()
    return threads, outcomes
