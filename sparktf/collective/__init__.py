"""Ring all-reduce among Spark barrier tasks (or plain processes), over sparktf's own sockets.

``Communicator`` is the entry point; ``bind_listener`` pre-binds a listening
socket for :meth:`Communicator.from_peers`; ``PeerDirectory`` is the
driver-side rendezvous for :meth:`Communicator.from_barrier_context`.  See
``docs/collective.md``.

May import: ``sparktf.errors`` only.
"""

from sparktf.collective.communicator import SUPPORTED_DTYPES, Communicator
from sparktf.collective.directory import PeerDirectory
from sparktf.collective.rendezvous import bind_listener, format_peer

__all__ = ["Communicator", "PeerDirectory", "SUPPORTED_DTYPES", "bind_listener", "format_peer"]
