"""The one place that builds a SparkSession.

The session reads and writes Delta tables (``spark.read.format("delta")``): it has Delta's
SQL extension and catalog, and Delta's jars (``delta_jars``).

Where a setting comes from, weakest first: octo's defaults (``DEFAULT_CONF``, master
``local[2]``), then ``spark-defaults.conf`` in ``$SPARK_CONF_DIR`` (else
``$SPARK_HOME/conf``; pip's pyspark is its own ``SPARK_HOME``), then the caller's ``conf``
(``octo run --conf``, the Dagster ``SparkResource``) and ``master``. Spark's launcher reads
``spark-defaults.conf`` itself when the session starts the JVM, but every setting given to the
builder beats the file; so an octo default is only passed when the file does not set that key.
"""
from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["spark_session", "session_conf", "spark_defaults_file", "spark_defaults_keys",
           "delta_package", "delta_jars", "hadoop_aws_packages", "in_s3", "object_store_conf",
           "packages", "DEFAULT_CONF", "DEFAULT_MASTER", "QUICK_START_CONF"]

DEFAULT_MASTER = "local[2]"

DEFAULT_CONF = {
    # Small local machines: 200 shuffle partitions made stateful batches ~16x slower.
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # A bad value in one row must not fail the whole pipeline: casts yield NULL, not errors.
    "spark.sql.ansi.enabled": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.memory": "4g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Spark keeps 100 compiled code-generated classes; one batch of a join + aggregate table
    # needs ~130, so every batch compiled them all again (~1 s of Janino per one-row batch).
    "spark.sql.codegen.cache.maxEntries": "4000",
    # What the driver keeps about finished queries, jobs, stages and tasks (for the UI and
    # its REST API; kept even with the UI off): a batch runs dozens of queries, and Spark's
    # defaults (1,000 queries with their plan graphs and metrics, 100,000 tasks) grow the
    # driver's heap for the whole of a long run.
    "spark.sql.ui.retainedExecutions": "50",
    "spark.ui.retainedJobs": "100",
    "spark.ui.retainedStages": "100",
    "spark.ui.retainedTasks": "1000",
    # Stopping a query waits this long for its thread, then fails instead of hanging.
    "spark.sql.streaming.stopTimeout": "60s",
    # Delta Lake in the session: a user's notebook or Dagster asset reads octo's tables with
    # spark.read.format("delta") (the jars: ``delta_jars``).
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Delta's default rebuilds a table's snapshot in 50 tasks: on 2 cores a read of a small
    # octo table took 3-4 s, with 2 tasks 0.3-1 s. Raise it with the cluster's cores.
    "spark.databricks.delta.snapshotPartitions": "2",
}
_JAR_KEYS = ("spark.jars", "spark.jars.packages")

# For short runs (demo, tests): the JIT's second tier costs more CPU than it saves when a run
# lasts seconds; measured on the demo, CPU time fell from ~224 s to ~124 s. Long-running
# streaming jobs should keep the default JIT.
QUICK_START_CONF = {"spark.driver.extraJavaOptions":
                    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=256m"}


def spark_defaults_file(environ: Mapping[str, str] | None = None) -> Path:
    """The ``spark-defaults.conf`` Spark's launcher reads (it may not exist)."""
    env = os.environ if environ is None else environ
    conf_dir = env.get("SPARK_CONF_DIR")
    if not conf_dir:
        home = env.get("SPARK_HOME")
        if not home:
            import pyspark

            home = str(Path(pyspark.__file__).parent)
        conf_dir = os.path.join(home, "conf")
    return Path(conf_dir) / "spark-defaults.conf"


def spark_defaults_keys(path: Path) -> set[str]:
    """The keys a Java properties file sets (what Spark's launcher will apply from it)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return set()
    keys = set()
    continued = False
    for raw in text.splitlines():
        line = raw.strip()
        was_continued, continued = continued, _continues(line)
        if was_continued or not line or line[0] in "#!":
            continue  # a continuation line belongs to the value above it
        key, i = [], 0
        while i < len(line) and line[i] not in "=: \t\f":
            if line[i] == "\\" and i + 1 < len(line):
                i += 1  # an escaped separator is part of the key
            key.append(line[i])
            i += 1
        keys.add("".join(key))
    return keys


def _continues(line: str) -> bool:
    """Whether a properties line goes on on the next one (an odd run of trailing ``\\``)."""
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def delta_package() -> str:
    """Maven coordinates of the Delta jar for the installed pyspark and delta-spark."""
    from importlib.metadata import version

    import pyspark

    spark = ".".join(pyspark.__version__.split(".")[:2])
    return f"io.delta:delta-spark_{spark}_2.13:{version('delta-spark')}"


# The AWS SDK release each Hadoop release's S3A was built against. hadoop-aws's POM names the
# SDK's ``bundle`` of every service (686 MB for 2.35.4: minutes to fetch on a new machine);
# these modules of the same release are what S3A loads (19 MB with their dependencies). A
# Hadoop release not listed here gets the bundle.
_AWS_SDK = {"3.5.0": "2.35.4"}
_AWS_MODULES = ("s3", "s3-transfer-manager", "apache-client", "netty-nio-client", "sts")
AWS_BUNDLE = "software.amazon.awssdk:bundle"


def hadoop_aws_packages() -> tuple[str, ...]:
    """Maven coordinates of Hadoop's S3A file system at the Hadoop version pyspark ships (its
    ``hadoop-client-api`` jar: the two must match), and of the AWS SDK's modules it uses
    (``_AWS_SDK``; resolved with ``AWS_BUNDLE`` excluded)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in jars.glob("hadoop-client-api-*.jar"):
        hadoop = jar.name.removeprefix("hadoop-client-api-")[:-4]
        sdk = _AWS_SDK.get(hadoop)
        return (f"org.apache.hadoop:hadoop-aws:{hadoop}",
                *(f"software.amazon.awssdk:{m}:{sdk}" for m in _AWS_MODULES if sdk))
    raise RuntimeError(f"no hadoop-client-api jar in {jars}: cannot choose hadoop-aws")


def in_s3(uri: str) -> bool:
    return uri.startswith(("s3://", "s3a://"))


def packages(uris: Iterable[str] = ()) -> tuple[str, ...]:
    """The Maven packages a session needs: Delta's, and S3A's when any of ``uris`` (the
    warehouse, the sources) is in S3."""
    return (delta_package(), *(hadoop_aws_packages() if any(map(in_s3, uris)) else ()))


def object_store_conf(uris: Iterable[str], environ: Mapping[str, str] | None = None
                      ) -> dict[str, str]:
    """Spark's settings to read ``uris`` in S3 as delta-rs and pyarrow read them: Hadoop's
    S3A file system for ``s3://`` as well as ``s3a://``, with the endpoint
    (``AWS_ENDPOINT_URL``: path-style addressing, TLS as its scheme says) and the region
    (``AWS_REGION``) of the same environment variables. Credentials are no settings (Spark's
    UI and event log show those): S3A reads ``AWS_ACCESS_KEY_ID`` and
    ``AWS_SECRET_ACCESS_KEY`` from each JVM's environment, as delta-rs does in each Python
    process. Empty when no URI is in S3."""
    if not any(map(in_s3, uris)):
        return {}
    env = os.environ if environ is None else environ
    fs = "spark.hadoop.fs.s3a."
    conf = {"spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if endpoint:
        conf.update({fs + "endpoint": endpoint, fs + "path.style.access": "true",
                     fs + "connection.ssl.enabled": str(endpoint.startswith("https:")).lower()})
        region = region or "us-east-1"  # an endpoint of one's own: any region signs
    if region:
        conf[fs + "endpoint.region"] = region
    return conf


def _jar_list(environ: Mapping[str, str], wanted: tuple[str, ...] | None = None) -> Path:
    """Where octo notes the jar files Spark fetched for ``wanted`` packages (default: only
    Delta's), one list per set of versions."""
    cache = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    name = "+".join(wanted or (delta_package(),)).replace(":", "_")
    if len(name) > 200:  # a file name's limit is 255 bytes
        name = f"{name[:150]}+{hashlib.sha256(name.encode()).hexdigest()[:16]}"
    return Path(cache) / "octo" / f"{name}.jars"


def delta_jars(environ: Mapping[str, str] | None = None,
               wanted: tuple[str, ...] | None = None) -> dict[str, str]:
    """How the session gets the jars of ``wanted`` packages (default: Delta's): the files an
    earlier session fetched, when every one is still on disk (no resolution, no Ivy report
    at start), but those of libraries Spark ships itself (``_spark_ships``), else the
    packages for Spark to fetch from Maven Central and cache (``~/.ivy2.5.2``) at its
    start."""
    wanted = wanted or (delta_package(),)
    listed = _jar_list(os.environ if environ is None else environ, wanted)
    try:
        jars = listed.read_text(encoding="utf-8").strip().split(",")
    except OSError:
        jars = []
    if jars and all(os.path.exists(j.removeprefix("file://")) for j in jars):
        ships = _spark_ships()
        return {"spark.jars": ",".join(j for j in jars
                                       if _artifact(j, fetched=True) not in ships)}
    modular = any(p.startswith("software.amazon.awssdk:") for p in wanted)
    return {"spark.jars.packages": ",".join(wanted),
            **({"spark.jars.excludes": AWS_BUNDLE} if modular else {})}


def _artifact(jar: str, fetched: bool = False) -> str:
    """A jar file's artifact name: ``hadoop-client-api`` of Spark's
    ``hadoop-client-api-3.5.0.jar``, and of ``org.apache.hadoop_hadoop-client-api-3.4.2.jar``
    as Spark's Ivy names what it ``fetched`` (``<organisation>_<artifact>-<revision>``)."""
    name = jar.rsplit("/", 1)[-1]
    if fetched:
        name = name.split("_", 1)[-1]
    found = re.match(r"(.+?)-\d", name)
    return found.group(1) if found else name


def _spark_ships() -> set[str]:
    """The artifacts whose jars pyspark ships (its ``jars`` directory). Delta's package also
    pulls older versions of some (Hadoop's client, Parquet, Jackson, log4j: 73 of its 86 MB
    of jars): the session's class loader looks in Spark's jars first, so they were never
    used, only copied into every session's temporary directory (left behind by a killed
    JVM) and opened at its start."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    return {_artifact(j.name) for j in jars.glob("*.jar")} if jars.is_dir() else set()


def _note_jars(spark: SparkSession, environ: Mapping[str, str],
               wanted: tuple[str, ...]) -> None:
    """Keep the jar files Spark resolved for the ``wanted`` packages, for the next
    sessions."""
    jars = spark.sparkContext.getConf().get("spark.jars", "")
    if "delta-spark" not in jars:
        return  # not resolved after all
    listed = _jar_list(environ, wanted)
    try:
        listed.parent.mkdir(parents=True, exist_ok=True)
        tmp = listed.with_name(f".{listed.name}.{os.getpid()}")
        tmp.write_text(jars, encoding="utf-8")
        tmp.replace(listed)
    except OSError:  # a read-only home: resolve again next time
        pass


def session_conf(*, master: str | None = None, conf: Mapping[str, str] | None = None,
                 app_name: str = "octo", environ: Mapping[str, str] | None = None,
                 defaults: Mapping[str, str] | None = None,
                 uris: Iterable[str] = ()) -> dict[str, str]:
    """The settings octo hands the session builder: its defaults (``DEFAULT_CONF``, the
    object store's for ``uris``, then the caller's ``defaults``) minus the keys
    ``spark-defaults.conf`` sets (the launcher applies those), then ``conf``, then
    ``master``. The jars of ``packages(uris)`` (``delta_jars``) come with the defaults unless
    the file or ``conf`` names jars themselves (``spark.jars``, ``spark.jars.packages``):
    those must then include Delta's (``delta_package``) and S3A's (``hadoop_aws_packages``, with
    ``spark.jars.excludes`` ``AWS_BUNDLE``)."""
    env = os.environ if environ is None else environ
    uris = tuple(uris)
    from_file = spark_defaults_keys(spark_defaults_file(env))
    ours = {"spark.master": DEFAULT_MASTER, "spark.app.name": app_name, **DEFAULT_CONF,
            **object_store_conf(uris, env), **(defaults or {})}
    if not any(k in from_file or k in (conf or {}) for k in _JAR_KEYS):
        ours.update(delta_jars(env, packages(uris)))
    settings = {k: v for k, v in ours.items() if k not in from_file}
    settings.update(conf or {})
    if master:
        settings["spark.master"] = master
    return settings


def spark_session(*, master: str | None = None, conf: Mapping[str, str] | None = None,
                  app_name: str = "octo", defaults: Mapping[str, str] | None = None,
                  uris: Iterable[str] = ()) -> SparkSession:
    """Get or create the session: ``local[2]`` unless ``master``, ``conf`` or
    ``spark-defaults.conf`` say otherwise (see the module docstring for the precedence;
    ``defaults`` are the caller's octo defaults); able to read ``uris`` (the warehouse and
    the sources: ``object_store_conf``)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from octo_platform.errors import SessionError

    builder = SparkSession.builder
    uris = tuple(uris)
    settings = session_conf(master=master, conf=conf, app_name=app_name,
                            defaults=defaults, uris=uris)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as e:
        if "spark.jars.packages" not in settings:
            raise
        raise SessionError(
            f"Spark did not start ({type(e).__name__}: {str(e).splitlines()[0]}). If the lines "
            f"above say it could not resolve {settings['spark.jars.packages']} (Maven Central "
            "unreachable), give it the jar files instead: --conf spark.jars=<delta-spark jar>,"
            "<delta-storage jar>,... (or spark-defaults.conf; a Dagster SparkResource's conf), "
            "or a local mirror with --conf spark.jars.ivySettings=<ivysettings.xml>") from e
    spark.sparkContext.setLogLevel("FATAL")  # octo reports failures itself
    _remember_jvm_names(spark)
    if settings.get("spark.jars.packages") == ",".join(packages(uris)):
        _note_jars(spark, os.environ, packages(uris))
    return spark


def _remember_jvm_names(spark: SparkSession) -> None:
    """Make the session's JVM view keep the classes its names resolve to, and those classes
    keep their static methods and nested classes once looked up.

    py4j asks the JVM again at every ``sc._jvm.PythonUtils`` (pyspark does, in every
    ``selectExpr``, ``agg`` and list it hands the JVM), then at every ``.toSeq`` on it: two
    round trips before the call. A short name is found by trying each package pyspark
    imported: every package tried before the right one is a miss that the class loader
    answers by looking in each of the class path's ~300 jars, uncached. In a Spark-path
    oracle (``test_oracle_joins.py``, 21 tables, 3 runs) that was 24,399 of the 133,494
    py4j commands, and 10.6 s of its 104 s in ``PythonUtils`` alone. A class and its methods
    do not change within a JVM; a field's value may, so fields are asked every time. (A
    ``java_import`` made later that would shadow a short name already used is not seen.)"""
    from py4j.java_gateway import JavaClass, JavaMember, JVMView

    view = spark.sparkContext._gateway.jvm
    if type(view) is not JVMView:
        return  # done for this JVM's view already

    def known(self, name: str, look_up):
        kept = self.__dict__.setdefault("_octo_known", {})
        if name not in kept:
            found = look_up(self, name)
            if isinstance(found, JavaClass):
                found.__class__ = KnownClass
            elif not isinstance(found, JavaMember):
                return found  # a package, or a field's value: asked every time
            kept[name] = found
        return kept[name]

    class KnownClass(JavaClass):
        def __getattr__(self, name: str):
            return known(self, name, JavaClass.__getattr__)

    class KnownView(JVMView):
        def __getattr__(self, name: str):
            return known(self, name, JVMView.__getattr__)

    view.__class__ = KnownView
