"""A silent local process cannot stall training: it connects to every new listener and says nothing.

The attacker finds the listening sockets that sparktf opens while training
(the driver's job channel, the ranks' ring listeners in the Python workers)
through ``/proc`` and holds several silent connections to each, from before
the real peers connect ("race") to the end ("slowloris"). Loopback only.
"""

import os
import socket
import threading
import time

import keras
import numpy as np
import pytest

from sparktf import MaxIteration, SeveralIteration, TFDataset, TFOptimizer

SILENT_PER_LISTENER = 4


def socket_inodes(pid):
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:  # the process ended
        pass
    return inodes


def loopback_listeners(pids):
    """Ports on 127.0.0.1 that the processes ``pids`` listen on."""
    inodes = set().union(*(socket_inodes(pid) for pid in pids))
    ports = set()
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes and fields[1].startswith("0100007F:"):
                ports.add(int(fields[1].split(":")[1], 16))
    return ports


class SilentAttacker:
    """Holds silent connections to every listener of ``pids()`` that was not there when it started."""

    def __init__(self, pids):
        self._pids = pids
        self._known = loopback_listeners(pids())  # Spark's own listeners (the PySpark daemon's) are left alone
        self._held, self.attacked = [], set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join()
        for sock in self._held:
            sock.close()

    def _run(self):
        while not self._stop.wait(0.01):
            for port in loopback_listeners(self._pids()) - self._known - self.attacked:
                self.attack(port)

    def attack(self, port):
        """Hold ``SILENT_PER_LISTENER`` silent connections to the listener on ``port``."""
        self.attacked.add(port)
        for _ in range(SILENT_PER_LISTENER):
            try:
                self._held.append(socket.create_connection(("127.0.0.1", port), timeout=1))
            except OSError:
                break


def train(tmp_path, name):
    x = np.random.default_rng(0).normal(size=(128, 3)).astype(np.float32)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    dataset = TFDataset.from_ndarrays((x, x @ np.ones((3, 1), np.float32)), batch_size=16)
    optimizer = TFOptimizer.from_keras(model, dataset, model_dir=str(tmp_path / name), collective_timeout=60)
    started = time.monotonic()
    history = optimizer.optimize(MaxIteration(60), checkpoint_trigger=SeveralIteration(20))  # 3 segments
    return history, time.monotonic() - started


@pytest.mark.parametrize("target", ["driver job channel", "ring listeners"])
def test_silent_connections_do_not_slow_training(sc, tmp_path, target, caplog, monkeypatch):
    from sparktf.collective.channel import JobChannel
    from sparktf.collective.rendezvous import parse_peer

    train(tmp_path, "warm")  # workers started and the step traced, for both runs alike
    _, undisturbed = train(tmp_path, "undisturbed")
    if target == "driver job channel":  # a new channel per call: found as it starts listening
        attacker = SilentAttacker(lambda: [os.getpid()])
    else:  # a rank's ring listener lives from its registration to its ring's connection: attacked in between
        attacker, register = SilentAttacker(lambda: []), JobChannel._register

        def register_attacked(channel, sock, rank, peer, claim):
            attacker.attack(parse_peer(peer)[1])  # before the channel tells any peer where it listens
            return register(channel, sock, rank, peer, claim)

        monkeypatch.setattr(JobChannel, "_register", register_attacked)
    with attacker:
        history, attacked = train(tmp_path, "attacked")
    assert history["iterations"] == 60 and len(history["loss"]) == 60
    assert len(attacker.attacked) >= (1 if target == "driver job channel" else 6)  # ring: 2 ranks x 3 segments
    assert attacked < 1.5 * undisturbed + 5, (attacked, undisturbed)
