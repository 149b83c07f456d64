"""URIs and local paths: the scheme, joining, names, and what each scheme needs installed."""

from __future__ import annotations

import os
import re
from typing import Optional, Tuple

__all__ = [
    "LOCAL_SCHEMES", "OBJECT_STORE_SCHEMES", "scheme_of", "is_local", "local_path", "join", "basename",
    "parent", "install_hint",
]

#: Schemes that name this machine's own files.
LOCAL_SCHEMES = frozenset({"", "file", "local"})

#: Object stores: a write becomes visible whole when the writer closes it, and a rename is a copy.
OBJECT_STORE_SCHEMES = frozenset({
    "s3", "s3a", "s3n", "gs", "gcs", "abfs", "abfss", "az", "wasb", "wasbs", "adl", "oss", "cos", "cosn",
    "obs", "r2", "oci",
})

#: The optional extra (and its package) that gives fsspec a scheme.
_EXTRAS = {
    "s3": ("s3", "s3fs"), "s3a": ("s3", "s3fs"), "s3n": ("s3", "s3fs"),
    "gs": ("gcs", "gcsfs"), "gcs": ("gcs", "gcsfs"),
    "abfs": ("azure", "adlfs"), "abfss": ("azure", "adlfs"), "az": ("azure", "adlfs"),
    "hdfs": ("hdfs", "pyarrow with libhdfs"),
}

# A scheme has two or more characters, so a Windows drive ("C:\\data") stays a local path.
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):")


def scheme_of(path: str) -> str:
    """The lower-case scheme of ``path`` (``""`` for a local path)."""
    match = _SCHEME.match(os.fspath(path))
    return match.group(1).lower() if match else ""


def is_local(path: str) -> bool:
    """True for a local path or a ``file:`` URI."""
    return scheme_of(path) in LOCAL_SCHEMES


def local_path(path: str) -> str:
    """The local path of a local path or ``file:`` URI (``file:///a``, ``file:/a`` -> ``/a``)."""
    path = os.fspath(path)
    scheme = scheme_of(path)
    if scheme == "":
        return path
    rest = path[len(scheme) + 1:]
    if rest.startswith("//"):
        authority, _, rest = rest[2:].partition("/")
        if authority not in ("", "localhost"):
            raise ValueError(f"{path!r} names a file on host {authority!r}; a {scheme}: URI must be local")
        rest = "/" + rest
    return rest


def join(base: str, *names: str) -> str:
    """``base/name/...``: ``os.path.join`` for local paths, ``/`` for URIs."""
    if scheme_of(base) == "":
        return os.path.join(base, *names)
    return "/".join([base.rstrip("/")] + [name.strip("/") for name in names])


def split(path: str) -> Tuple[str, str]:
    """``(parent, name)`` of ``path``."""
    if scheme_of(path) == "":
        return os.path.split(path)
    head, _, tail = path.rstrip("/").rpartition("/")
    return head, tail


def basename(path: str) -> str:
    """The last part of ``path``."""
    return split(path)[1]


def parent(path: str) -> str:
    """The folder that holds ``path``."""
    return split(path)[0]


def install_hint(scheme: str) -> Optional[str]:
    """``pip install 'sparktf[extra]'  (package)`` for a scheme sparktf knows an extra of, else None."""
    found = _EXTRAS.get(scheme)
    return None if found is None else f"pip install 'sparktf[{found[0]}]' ({found[1]})"
