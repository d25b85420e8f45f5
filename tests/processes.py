"""Start a process tree in its own session and stop every process of it by id.

`dagster dev` spawns a webserver, a daemon, a code server and, per run, a run worker with a
Spark JVM. Started from a script in the background it inherits an ignored SIGINT (so Python
never raises KeyboardInterrupt) and shrugs off SIGTERM; signals to the process group reach
the JVM, which ignores SIGINT by design. So: reset SIGINT in the child, start it as a new
session (no descendant calls setsid, so the session id names the whole tree), and stop it
with SIGINT to the leader, then SIGTERM and SIGKILL to each remaining process by id.
Reads /proc only (no psutil).
"""
from __future__ import annotations

import os
import signal
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["start_session", "session_pids", "stop_session", "run_killing", "mid_run",
           "octo_run"]


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session id) of a live process, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # exited meanwhile
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # the command name may contain spaces
    return fields[0], int(fields[1]), int(fields[3])


def session_pids(sid: int, known: set[int] = frozenset()) -> set[int]:
    """Live (not zombie) processes of session ``sid``, plus any still-live pid of ``known``
    and their descendants (in case something left the session)."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None and st[0] != "Z":
            table[int(entry)] = st
    alive = {pid for pid, (_, _, s) in table.items() if s == sid} | (set(known) & set(table))
    grew = True
    while grew:
        more = {pid for pid, (_, ppid, _) in table.items() if ppid in alive} - alive
        alive |= more
        grew = bool(more)
    return alive


def _names(pids: set[int]) -> dict[int, str]:
    """pid -> the first words of its command line (for reports)."""
    names = {}
    for pid in sorted(pids):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        names[pid] = " ".join(a.decode(errors="replace") for a in argv[:4])[:80]
    return names


def _reset_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_session(argv: Sequence[str], **kwargs) -> subprocess.Popen:
    """``Popen`` as the leader of a new session, SIGINT at its default (KeyboardInterrupt)."""
    return subprocess.Popen(list(argv), start_new_session=True, preexec_fn=_reset_sigint,
                            **kwargs)


def _wait_gone(proc: subprocess.Popen, pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    while True:
        proc.poll()  # reap the leader: it is our child
        left = session_pids(proc.pid, pids)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def stop_session(proc: subprocess.Popen, *, grace: float = 30.0,
                 term: float = 10.0) -> dict[str, object]:
    """Stop the leader's whole session, by process id; returns what it took.

    SIGINT to the leader (a graceful shutdown stops its children), after ``grace`` seconds
    SIGTERM to every process still alive, after ``term`` more seconds SIGKILL.
    """
    seen = session_pids(proc.pid, {proc.pid})
    report: dict[str, object] = {"processes": _names(seen)}
    steps = ((signal.SIGINT, grace, False), (signal.SIGTERM, term, True),
             (signal.SIGKILL, term, True))
    for sig, timeout, everyone in steps:
        left = session_pids(proc.pid, seen)
        if not left:
            break
        seen |= left
        for pid in sorted(left) if everyone else [proc.pid]:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        left = _wait_gone(proc, seen, timeout)
        report[sig.name] = sorted(left)  # still alive after this signal
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    report["survivors"] = sorted(session_pids(proc.pid, seen))
    return report


def archived_options(base: str = "") -> str:
    """``java_options(base)`` once the class archive exists: made now, or by the process
    making it (which holds its lock; another part of the suite, say)."""
    from octo_platform.runtime.class_archive import java_options

    deadline = time.monotonic() + 300
    while "-XX:SharedArchiveFile=" not in (options := java_options(base)) \
            and time.monotonic() < deadline:
        time.sleep(1)
    return options


def octo_run(project: Path) -> list[str]:
    """``octo run --all --until-idle`` of ``project`` as a short-lived process: its JVM with
    the JIT's first tier only (``QUICK_START_CONF``, as the Dagster catch-up runs have), which
    saves the killed-and-restarted runs of a test a fifth of their time."""
    from octo_platform.runtime.class_archive import quick_start_conf

    (java,) = quick_start_conf().items()
    return [sys.executable, "-m", "octo_platform.cli", "run", "--all", "--until-idle",
            "--project", str(project), "--conf", "=".join(java)]


def run_killing(cmd: Sequence[str], log: Path, *, until: Callable[[subprocess.Popen], None],
                kills: int, attempts: int, env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` (its output appended to ``log``) again and again: the first ``kills``
    runs still alive once ``until(proc)`` returns are SIGKILLed with their whole process
    group (the JVM and Python workers too); the run after them must exit 0. Returns the
    number of runs killed."""
    killed = 0
    for _attempt in range(attempts):
        with open(log, "ab") as out:  # a file, not a pipe: a full pipe would stall the run
            proc = subprocess.Popen(list(cmd), env=env, start_new_session=True, stdout=out,
                                    stderr=subprocess.STDOUT)
        try:
            until(proc)
            if proc.poll() is None and killed < kills:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                killed += 1
                continue
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 0, log.read_text()[-5000:]
        return killed
    raise AssertionError(f"{attempts} runs and none finished: {log.read_text()[-3000:]}")


def mid_run(log: Path, rng: random.Random, *, batches: tuple[int, int] = (1, 1),
            delay: float = 2.0, timeout: float = 300.0) -> Callable[[subprocess.Popen], None]:
    """An ``until`` for `run_killing`: a random moment in the middle of a run, however fast
    its batches are. It waits until the run has logged a random number (in ``batches``) of new
    batch lines, then a random time of at most ``delay`` seconds."""
    log.touch()

    def until(proc: subprocess.Popen) -> None:
        wanted = log.read_text().count("] batch ") + rng.randint(*batches)
        deadline = time.monotonic() + timeout
        while log.read_text().count("] batch ") < wanted and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0, delay))
    return until
