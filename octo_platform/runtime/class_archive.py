"""A class-data-sharing archive of what a Spark driver loads, for JVMs that live seconds.

A short run (the demo, a Dagster catch-up run, a test's ``octo run``) spends seconds loading
and verifying Spark's classes: a one-row batch in a fresh process took 7.8–8.3 s, of which
the batch 2.1–2.3 s; with an archive of the classes (JDK's dynamic CDS,
``-XX:SharedArchiveFile``) 4.6–6.0 s and 1.0 s. The archive is made once per machine and
environment (the java binary, pyspark, Delta's jars: its file name holds a digest of them)
by a training process: a session whose JVM has ``-XX:ArchiveClassesAtExit`` runs a few small
queries, then its JVM exits and writes the archive under a temporary name, which is renamed
into place only once the JVM has exited: a partial archive would stop every later JVM from
starting. A JVM that finds the archive stale (another java) ignores it, quietly. One process
trains at a time (a lock file); the others go on without the archive meanwhile.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

__all__ = ["quick_start_conf", "driver_defaults", "java_options", "archive_path"]

_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_OPTIONS = "spark.driver.extraJavaOptions"
# The JIT compiles a method after 10x Java's default number of calls: a short run's driver
# spent most of its CPU compiling Spark's start-up and planning code, which runs a few
# times. A fresh `octo run` of a 4,010-row batch: 60-61 CPU-s against 70-71; a 1M-row
# batch 103 against 110-120; the `octo run`s of test_cli.py and test_crash.py 432-446
# against 470-483; the same wall times (benchmarks/README.md).
_JIT_LATER = "-XX:CompileThresholdScaling=10"
_STALE_LOCK_S = 600.0  # a lock older than this was left by a killed trainer
_TRAIN_TIMEOUT_S = 300.0


def archive_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where this environment's archive is (or would be); None when no java is found."""
    from octo_platform.runtime.session import delta_package

    env = os.environ if environ is None else environ
    home = env.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    java = os.path.realpath(java)
    import pyspark

    stat = os.stat(java)
    key = "|".join([java, str(stat.st_size), str(int(stat.st_mtime)), pyspark.__version__,
                    delta_package()])
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(cache) / "octo" / f"spark-classes-{digest}.jsa"


def quick_start_conf(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``session.QUICK_START_CONF`` with this environment's class archive (``java_options``)."""
    from octo_platform.runtime.session import QUICK_START_CONF

    return {**QUICK_START_CONF, _OPTIONS: java_options(QUICK_START_CONF[_OPTIONS], environ)}


def driver_defaults(conf: Mapping[str, str], *, quick: bool = False) -> dict[str, str]:
    """octo's default options for the driver's JVM, as ``spark_session``'s ``defaults``: the
    class archive, and the JIT and collector of ``QUICK_START_CONF`` with ``quick``, else a
    JIT that compiles later (``_JIT_LATER``). Nothing
    (and no archive made for nothing) when ``conf`` or ``spark-defaults.conf`` set the
    driver's options, which beat octo's defaults, or when this process already runs a
    session (its JVM has started)."""
    from pyspark import SparkContext

    from octo_platform.runtime.session import (
        QUICK_START_CONF,
        spark_defaults_file,
        spark_defaults_keys,
    )

    if _OPTIONS in conf or _OPTIONS in spark_defaults_keys(spark_defaults_file()) \
            or SparkContext._active_spark_context is not None:
        return {}
    options = java_options(QUICK_START_CONF[_OPTIONS] if quick else _JIT_LATER).strip()
    return {_OPTIONS: options} if options else {}


def java_options(base: str, environ: Mapping[str, str] | None = None) -> str:
    """``base`` (JVM options) plus this environment's class archive: made first (about 15 s,
    once per machine) when there is none yet and no other process is making it."""
    path = archive_path(environ)
    if path is None:
        return base
    if not path.exists():
        _make(path, base)
    return f"{base} -XX:SharedArchiveFile={path} {_QUIET}" if path.exists() else base


def _make(path: Path, base: str) -> None:
    """Run the training process and put its archive at ``path`` (see the module docstring)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = path.with_name(f"{path.name}.lock")
        if lock.exists() and time.time() - lock.stat().st_mtime > _STALE_LOCK_S:
            lock.unlink(missing_ok=True)
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except OSError:  # another process is making it, or the cache is not writable
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        os.close(fd)
        print(f"octo: archiving Spark's classes for faster JVM starts (once, about 30 s): "
              f"{path}", file=sys.stderr, flush=True)
        done = subprocess.run(
            [sys.executable, "-m", "octo_platform.runtime.class_archive", str(tmp), base],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
            timeout=_TRAIN_TIMEOUT_S, check=False)
        if done.returncode == 0 and tmp.exists():
            os.replace(tmp, path)
    except (OSError, subprocess.SubprocessError):
        pass  # no archive: JVMs start as before
    finally:
        tmp.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)


def _train(out: str, base: str) -> None:
    """The training process: a session dumping its classes to ``out`` at its JVM's exit."""
    import pyarrow as pa
    from pyspark import SparkContext

    from octo_platform.local_frames import collect_arrow, local_frame
    from octo_platform.runtime.session import spark_session

    spark = spark_session(conf={_OPTIONS:
                                f"{base} -XX:ArchiveClassesAtExit={out} {_QUIET}"})
    lines = local_frame(spark, pa.table({"value": ['{"k": 1, "v": "a"}', "{"],
                                         "file": ["f", "f"]}))
    parsed = lines.selectExpr("from_json(value, 'k BIGINT, v STRING') AS r", "file")
    collect_arrow(parsed.selectExpr("r.k", "r.v", "file").filter("r.k IS NOT NULL"), 2)
    parsed.selectExpr("r.*").groupBy("k").count().toArrow()
    gateway = SparkContext._gateway
    spark.stop()
    gateway.proc.stdin.close()  # the JVM exits on end of input, writing the archive
    gateway.proc.wait(timeout=_TRAIN_TIMEOUT_S)


if __name__ == "__main__":
    _train(sys.argv[1], sys.argv[2])
