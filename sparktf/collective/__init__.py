"""Ring all-reduce among Spark barrier tasks (or plain processes), over sparktf's own sockets.

``Communicator`` is the entry point; ``bind_listener`` pre-binds a listening
socket for :meth:`Communicator.from_peers`; ``JobChannel`` is the driver's
server for one barrier job (the peer directory of
:meth:`Communicator.from_barrier_context`, model state, heartbeats) and
``channel_client`` the ranks' side of it.  See ``docs/design/collective.md``.

May import: ``sparktf.errors`` only.
"""

from sparktf.collective.communicator import SUPPORTED_DTYPES, WIRE_DTYPES, Communicator
from sparktf.collective.channel import JobChannel
from sparktf.collective.rendezvous import bind_listener, format_peer

__all__ = ["Communicator", "JobChannel", "SUPPORTED_DTYPES", "WIRE_DTYPES", "bind_listener", "format_peer"]
