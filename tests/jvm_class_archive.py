"""One class-data-sharing archive of Spark's classes for every JVM the tests start.

Each Spark JVM of the suite (test sessions, local-cluster executors, a
standalone master and workers, Connect servers, the example programs') loads
the same few thousand Spark and Scala classes from the same jars. A JDK
dynamic CDS archive of them, dumped once by a driver JVM that ran a Python and
an Arrow job, lets the others map those classes instead of loading and
verifying them: a ``local-cluster[2,1,1024]`` app's start and first job went
from 14 to 9.5 CPU-seconds, a ``local[2]`` one's from 7 to 4.7, and the whole
suite's from 1,123 to 1,040 (10:14 to 9:33 on 2 cores). The archive
lives in the virtual environment, one per pyspark version and JDK; a JVM that
cannot use it (another class path, e.g. Spark's launcher) runs without it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from typing import Optional

#: The options of every JVM the tests start (see ``tests/conftest.py``), before the archive's.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
#: Seconds the dumping program may take (a Spark session, two jobs, the dump).
DUMP_SECONDS = 180
#: No JVM complains about an archive it cannot use (the launcher's class path differs).
QUIET = "-Xlog:cds=off,cds+dynamic=off"

_DUMP_PROGRAM = r"""
import sys
from pyspark.sql import SparkSession

spark = (SparkSession.builder.master("local[1]")
         .config("spark.driver.extraJavaOptions", "-XX:ArchiveClassesAtExit=" + sys.argv[1])
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).collect()
spark.range(100).selectExpr("id * 2 AS twice").mapInArrow(lambda batches: batches, "twice long").collect()
spark.stop()
"""


def java_tool_options(base: str) -> str:
    """``base`` plus the archive's options, the archive dumped first if it is missing; ``base`` if that fails."""
    path = _archive_path(base)
    if path is None or not (os.path.exists(path) or _dump(path, base)):
        return base
    return f"{base} -XX:SharedArchiveFile={path} {QUIET}"


def _archive_path(base: str) -> Optional[str]:
    java = shutil.which("java")
    if java is None:
        return None
    import pyspark

    key = hashlib.sha256(f"{pyspark.__version__}|{os.path.realpath(java)}|{base}".encode()).hexdigest()[:16]
    return os.path.join(sys.prefix, "sparktf-tests", f"spark-classes-{key}.jsa")


def _dump(path: str, base: str) -> bool:
    """Dump the archive to ``path`` from a driver JVM of its own; whether it worked."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.partial"
    env = {**os.environ, "JAVA_TOOL_OPTIONS": base, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    try:
        subprocess.run([sys.executable, "-c", _DUMP_PROGRAM, partial], env=env, capture_output=True,
                       timeout=DUMP_SECONDS, check=True)
        os.replace(partial, path)
        return True
    except (OSError, subprocess.SubprocessError):
        if os.path.exists(partial):
            os.remove(partial)
        return False


if __name__ == "__main__":  # `make test`'s install step: the archive is dumped there, not in the first test run
    print(java_tool_options(TEST_JVM_OPTIONS))
