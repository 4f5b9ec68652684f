"""A local SparkSession set up the way the bridge's tests, benchmark and demo run Spark:
Java 17 pinned through ``JAVA_HOME``, the executors' Python the driver's own interpreter
(so they import ``spark_bridge`` from the same environment), loopback only, no UI, quiet
logs, UTC session time zone, and ``terrascale`` registered."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tempfile

from spark_bridge.errors import BridgeError

_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


def _major(java: str) -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)', out)
    return int(m.group(1)) if m else None


def java_home() -> str:
    """A Java 17 installation: ``JAVA_HOME`` if it is one, else the system's (Debian's
    ``openjdk-17-jre-headless`` lands in /usr/lib/jvm/java-17-openjdk-*)."""
    candidates = [os.environ.get("JAVA_HOME", "")] + sorted(glob.glob("/usr/lib/jvm/java-17-openjdk*")) + \
        sorted(glob.glob("/usr/lib/jvm/*17*"))
    for home in filter(None, candidates):
        if os.path.exists(os.path.join(home, "bin", "java")) and _major(os.path.join(home, "bin", "java")) == 17:
            return home
    raise BridgeError("Spark needs a Java 17 runtime and none was found: run `make java17` (installs "
                      "openjdk-17-jre-headless with apt-get) or set JAVA_HOME to a Java 17")


def local_session(cores: int = 2, max_failures: int = 1, app: str = "terrascale", conf: dict | None = None,
                  jvm: bool = True):
    """Start (or return the running) local session and register the data source; with ``jvm``
    (and the jar built: ``make jvm``) the JVM reader is on the classpath and serves batch reads."""
    os.environ["JAVA_HOME"] = java_home()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j = os.path.join(tempfile.gettempdir(), "terrascale-spark-log4j2.properties")
    with open(log4j, "w") as f:
        f.write(_LOG4J2)
    from pyspark.sql import SparkSession

    import spark_bridge

    master = f"local[{cores}]" if max_failures <= 1 else f"local[{cores},{max_failures}]"
    b = (SparkSession.builder.master(master).appName(app)
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
         .config("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}"))
    jar = spark_bridge.jvm_jar()
    if jar is not None and jvm:  # the JVM reader serves format("terrascale") (docs/spark.md, "Readers")
        b = b.config("spark.jars", jar)
    for k, v in (conf or {}).items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark_bridge.register(spark)
    return spark
