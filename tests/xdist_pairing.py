"""A pytest-xdist file scheduler that runs the files that mostly wait beside files that keep both cores busy.

``make test`` runs two pytest-xdist processes on two cores, each taking one
whole file at a time (``--dist loadfile``). Some files mostly wait (for a
watchdog, a timeout, an executor given back, a server to start); two of them
side by side, or one beside a file of small tests, left a quarter to a third
of both cores idle for minutes. Other files keep both cores busy by
themselves (two training workers and a driver that all compute) and use
whatever core the other process leaves idle.

When a process needs its next file, this scheduler looks at the file the
other process runs: beside a waiting file it takes the first busy file of
the queue (else the first that does not wait); beside a busy file, the first
waiting file. Otherwise, or without such a file, it takes the head of the
queue, as ``--dist loadfile`` does.
"""

from pathlib import PurePath
from typing import Collection, Iterable

from xdist.scheduler import LoadFileScheduling


class WaitingBesideBusy(LoadFileScheduling):
    """``--dist loadfile`` that pairs ``waiting_files`` with ``busy_files`` (file names) where the queue allows."""

    def __init__(self, config, log, waiting_files: Collection[str], busy_files: Collection[str]):
        super().__init__(config, log)
        self.waiting_files = frozenset(waiting_files)
        self.busy_files = frozenset(busy_files)

    def _kind(self, scope: str) -> str:
        name = PurePath(scope.split("::")[0]).name
        return "waiting" if name in self.waiting_files else "busy" if name in self.busy_files else "other"

    def _running(self, node) -> str:
        """The file ``node`` runs now, or will run next (xdist assigns a file before the one before ends)."""
        scopes = list(self.assigned_work[node].items())
        unfinished = [scope for scope, tests in scopes if not all(tests.values())]
        return (unfinished or [scope for scope, _ in scopes] or [""])[-1]

    def _first(self, tiers: Iterable[Collection[str]]):
        """The first queued file of the first tier (a set of kinds) that has one."""
        for kinds in tiers:
            scope = next((scope for scope in self.workqueue if self._kind(scope) in kinds), None)
            if scope is not None:
                return scope
        return None

    def _assign_work_unit(self, node) -> None:
        beside = {self._kind(self._running(other)) for other in self.assigned_work if other is not node}
        if "waiting" in beside:
            tiers = [{"busy"}, {"other"}]
        elif "busy" in beside:
            tiers = [{"waiting"}]
        else:
            tiers = []
        chosen = self._first(tiers)
        if chosen is not None:
            self.workqueue.move_to_end(chosen, last=False)
        super()._assign_work_unit(node)
