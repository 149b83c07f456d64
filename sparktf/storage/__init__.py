"""Every path sparktf reads or writes, local or a URI of cluster storage, through one interface.

``store_for(path)`` picks the route (see :mod:`sparktf.storage.routes`):
local files, the classic session's Hadoop ``FileSystem``, or fsspec. The rest
of sparktf asks a :class:`~sparktf.storage.base.Store` for what it needs and
never branches on the kind of storage or session. See ``docs/guides/storage.md``.
"""

from sparktf.storage.base import Store
from sparktf.storage.routes import store_for
from sparktf.storage.transfer import kept_local_copy, local_copy, read_text, write_text
from sparktf.storage.uri import basename, is_local, join, local_path, scheme_of

__all__ = [
    "Store", "store_for", "local_copy", "kept_local_copy", "read_text", "write_text",
    "join", "basename", "is_local", "local_path", "scheme_of",
]
