"""Model state from the driver to the tasks: streamed from the job's channel, or read from a broadcast.

The driver serves a :class:`~sparktf.training.checkpoint.ModelState` on a
:class:`~sparktf.collective.JobChannel` (see
:func:`sparktf.training.segment_job.job_channel`); a task fetches it with
:meth:`StateSource.fetch`. Without a channel (``spark.sparktf.rendezvous=barrier``)
the state rides in a Spark broadcast instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from sparktf.collective.channel_client import ChannelClient, start_heartbeat
from sparktf.training.checkpoint import ModelState

__all__ = ["StateSource"]


@dataclass(frozen=True)
class StateSource:
    """Where a task gets the state: the channel at ``address``, else ``broadcast``.

    Attributes
    ----------
    address : str, optional
        ``"host:port"`` of the job channel.
    secret : bytes
        The job secret.
    world_size : int
        Ranks (tasks) the channel serves.
    timeout : float
        Seconds to wait for the channel's bytes.
    broadcast : pyspark.Broadcast, optional
        The state, when there is no channel.
    """

    address: Optional[str]
    secret: bytes
    world_size: int
    timeout: float
    broadcast: Any = None

    def heartbeat(self, rank: int) -> Any:
        """A heartbeat of the task of ``rank`` to the channel (a stand-in without one)."""
        return start_heartbeat(self.address, rank, self.world_size, self.secret, self.timeout)

    def fetch(self, rank: int) -> ModelState:
        """The state, for the task of ``rank``."""
        if self.address is None:
            return self.broadcast.value
        with ChannelClient(self.address, rank, self.world_size, self.secret, self.timeout) as client:
            meta, arrays = client.request({"op": "get_state"}, self.timeout, what="fetching the model state")
        return ModelState.from_wire(meta, arrays)
