"""`make test`: the suite as two pytest processes side by side.

The tests marked ``processes`` (see ``pyproject.toml``) spend most of their time waiting on
other processes: `octo run` subprocesses starting their JVMs and being SIGKILLed, a Kafka
broker, `dagster dev` and its daemon's loops. Alone they kept about one of this machine's
two cores busy (450 s of wall time, 425 core-seconds). They run in their own pytest process
beside the rest, which keeps the cores busy with in-process Spark work; each process has
its own SparkSession and its own temporary directory. In a clean clone on 2026-12-02 the
``processes`` part took 11:05 and the rest 10:32.

Delta's jars are fetched (Maven Central, then cached) by one session before the two start,
so two JVMs never resolve them into the same Ivy cache at once.

Unless ``JAVA_HOME`` is set, the tests run on the newest JDK Spark 4.2 supports (17, 21, 25)
among those installed under ``/usr/lib/jvm`` (``newest_java``): this machine has Debian's
17 and Temurin's 25. On 25 a fresh `octo run` of one 100K-row Spark-path batch
(``benchmarks/big_batch.py --rows 100000`` under ``cpu_by_process.py``, in turn) took 30.1
and 26.7 s (45.8 and 41.6 CPU-s) against 42.8 and 36.1 s (64.2 and 53.9 CPU-s) on 17, and
``test_oracle_joins.py[spark]`` 334.8 and 304.9 CPU-s against 347.4 and 328.3.

Arguments go to both pytest processes. The exit status is non-zero if either failed; the
output of the ``processes`` part follows the other's. Its clean-clone times, run by run:
benchmarks/README.md ("`make test` in clean clones").
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NONE_SELECTED = 5  # pytest's exit status when no test was selected
SPARK_JAVA = (17, 21, 25)  # the Java releases Spark 4.2 runs on


def newest_java(jvms: Path = Path("/usr/lib/jvm")) -> str | None:
    """The home of the newest JDK under ``jvms`` that Spark runs on (None: none found)."""
    homes: dict[int, str] = {}
    for release in sorted(jvms.glob("*/release")):
        try:
            found = re.search(r'^JAVA_VERSION="(\d+)', release.read_text(), re.M)
        except OSError:
            continue
        if found and int(found.group(1)) in SPARK_JAVA and (release.parent / "bin/java").exists():
            homes.setdefault(int(found.group(1)), str(release.parent))
    return homes[max(homes)] if homes else None


def fetch_jars() -> None:
    """Start and stop a session once if Delta's jars are not known to be on disk."""
    from octo_platform.runtime.session import delta_jars

    if "spark.jars.packages" in delta_jars():
        subprocess.run([sys.executable, "-c", "from octo_platform.runtime.session import "
                        "spark_session; spark_session().stop()"], cwd=ROOT, check=True)


def main(args: list[str]) -> int:
    if not os.environ.get("JAVA_HOME") and (home := newest_java()):
        os.environ["JAVA_HOME"] = home
        print(f"suite: Java from {home} (set JAVA_HOME to choose another)", flush=True)
    fetch_jars()
    base = Path(tempfile.mkdtemp(prefix="octo-tests-"))
    pytest = [sys.executable, "-m", "pytest", *args]
    log = base / "processes.log"
    with open(log, "wb") as out:
        waiting = subprocess.Popen(
            [*pytest, "-m", "processes", f"--basetemp={base / 'processes'}"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            rest = subprocess.run([*pytest, "-m", "not processes",
                                   f"--basetemp={base / 'rest'}"], cwd=ROOT).returncode
        except BaseException:
            waiting.terminate()
            raise
        finally:
            waited = waiting.wait()
    print(f"\n===== the tests marked `processes` (ran alongside; {log}) =====",
          flush=True)
    sys.stdout.buffer.write(log.read_bytes())
    # 5: no test selected (arguments that name tests of one part only)
    codes = [0 if c == NONE_SELECTED and {rest, waited} != {NONE_SELECTED} else c
             for c in (rest, waited)]
    print(f"\nsuite: {'FAILED' if any(codes) else 'passed'} (the rest: exit {rest}, "
          f"`processes`: exit {waited})", flush=True)
    if not any(codes):  # a failure keeps the tests' directories and the log, to look into
        shutil.rmtree(base, ignore_errors=True)
    return max(codes)


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.exit(main(sys.argv[1:]))
