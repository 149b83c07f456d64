"""Which :class:`SessionKind` a session is."""

from __future__ import annotations

from typing import Any

import pyspark

from sparktf.errors import SparkTFError
from sparktf.spark.resources import PYSPARK_MAJOR
from sparktf.spark.session_kind import SessionKind

__all__ = ["session_kind", "is_connect"]


def is_connect(session: Any) -> bool:
    """Whether ``session`` is a Spark Connect client session."""
    module = type(session).__module__
    return module.startswith("pyspark.sql.connect")


def session_kind(session: Any) -> SessionKind:
    """The :class:`SessionKind` of ``session`` (a classic or a Spark Connect ``SparkSession``).

    Raises
    ------
    SparkTFError
        A Spark Connect session with pyspark older than 4.0.
    """
    if is_connect(session):
        if PYSPARK_MAJOR < 4:
            raise SparkTFError(
                f"sparktf runs in Spark Connect sessions with pyspark 4.0 or newer (this is pyspark "
                f"{pyspark.__version__}): pip install 'sparktf[connect]', or use a classic session"
            )
        from sparktf.spark.connect_session import ConnectSession

        return ConnectSession(session)
    from sparktf.spark.classic_session import ClassicSession

    return ClassicSession(session)
