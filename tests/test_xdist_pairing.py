"""The suite's own file scheduler (``tests/xdist_pairing.py``): a file that mostly waits runs beside a busy one."""

from types import SimpleNamespace

from xdist_pairing import WaitingBesideBusy

FILES = ("test_waits_first.py", "test_waits_too.py", "test_small.py", "test_busy.py")


class Node:
    """What xdist's scheduler needs of a worker."""

    def __init__(self, name):
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False

    def send_runtest_some(self, indexes):
        pass

    def shutdown(self):
        self.shutting_down = True


def files_of(scheduler, node):
    return [scope.split("/")[-1] for scope in scheduler.assigned_work[node]]


def finish(scheduler, node, file):
    collection = scheduler.registered_collections[node]
    for index, nodeid in enumerate(collection):
        if nodeid.startswith(f"tests/{file}::"):
            scheduler.mark_test_complete(node, index)


def test_a_waiting_file_starts_beside_a_busy_one_and_never_beside_another_waiting_one_while_others_are_queued():
    config = SimpleNamespace(getvalue={"tx": ["2*popen"]}.get, option=SimpleNamespace(loadscopereorder=False))
    scheduler = WaitingBesideBusy(config, None, waiting_files=FILES[:2], busy_files=FILES[3:])
    collection = [f"tests/{file}::test_{index}" for file in FILES for index in range(3)]
    first, second = Node("gw0"), Node("gw1")
    for node in (first, second):
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    assert files_of(scheduler, first) == ["test_waits_first.py"]  # the head of the queue
    assert files_of(scheduler, second) == ["test_busy.py"]  # beside a waiting file: the busy one, not the next

    finish(scheduler, second, "test_busy.py")
    assert files_of(scheduler, second)[1:] == ["test_small.py"]  # beside a waiting file, no busy one left
    finish(scheduler, first, "test_waits_first.py")
    assert files_of(scheduler, first)[1:] == ["test_waits_too.py"]  # the last file: the queue's head
