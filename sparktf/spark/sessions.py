"""Which :class:`SessionKind` a session is."""

from __future__ import annotations

from typing import Any

from sparktf.spark.session_kind import SessionKind

__all__ = ["session_kind", "is_connect"]


def is_connect(session: Any) -> bool:
    """Whether ``session`` is a Spark Connect client session."""
    module = type(session).__module__
    return module.startswith("pyspark.sql.connect")


def session_kind(session: Any) -> SessionKind:
    """The :class:`SessionKind` of ``session`` (a classic or a Spark Connect ``SparkSession``)."""
    if is_connect(session):
        from sparktf.spark.connect_session import ConnectSession

        return ConnectSession(session)
    from sparktf.spark.classic_session import ClassicSession

    return ClassicSession(session)
