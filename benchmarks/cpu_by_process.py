"""Run a command and say whose CPU it used: its process tree, sampled from ``/proc``.

    .venv/bin/python benchmarks/cpu_by_process.py [--every SECONDS] -- COMMAND [ARG...]

Every ``--every`` seconds (0.3 by default) it reads the user + system time of each process
below the command (``/proc/<pid>/stat``), keeps each one's last reading, and at the end
prints the command's wall time and the CPU seconds by kind: ``java`` (the JVMs),
``python workers`` (pyspark's daemon and the workers it forks), ``command`` (the command's
own process) and the others by their command line. A process that lives less than one
interval may be missed, and the CPU a process used after its last reading is not counted:
the figures are a lower bound, good for comparing runs. With ``--jvms`` it also lists each
JVM: its CPU seconds, how long it was seen, and the command of the process that started it
(the pytest process's session, an ``octo run``, a Dagster run worker). Linux only. Exit
status: the command's.

Used to find where the suite's CPU goes (benchmarks/README.md, "The test session's JIT"):
``JDK_JAVA_OPTIONS=... .venv/bin/python benchmarks/cpu_by_process.py -- .venv/bin/python -m
pytest ...``.
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time

_TICK = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, int, str]]:
    """Every process: pid -> (parent pid, CPU ticks so far, command line)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/cmdline") as f:
                cmd = f.read().replace("\0", " ").strip()
        except OSError:  # it ended while being read
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the name, which may hold spaces
        found[int(name)] = (int(fields[1]), int(fields[11]) + int(fields[12]), cmd)
    return found


def _kind(pid: int, root: int, cmd: str) -> str:
    if pid == root:
        return "command"
    program = os.path.basename(cmd.split(" ", 1)[0])
    if program == "java":
        return "java"
    if "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
        return "python workers"
    return cmd[:70] or f"pid {pid}"


def _tree(root: int, procs: dict[int, tuple[int, int, str]]) -> set[int]:
    tree, grew = {root}, True
    while grew:
        below = {pid for pid, (parent, _, _) in procs.items()
                 if parent in tree and pid not in tree}
        tree |= below
        grew = bool(below)
    return tree


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=float, default=0.3, help="seconds between readings")
    ap.add_argument("--jvms", action="store_true", help="list each JVM, by its parent")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given")
    started = time.monotonic()
    proc = subprocess.Popen(command)
    last: dict[int, tuple[str, int]] = {}  # pid -> (kind, CPU ticks at its last reading)
    jvms: dict[int, list] = {}  # pid -> [first seen, last seen, the parent's command]
    while proc.poll() is None:
        procs, now = _processes(), time.monotonic()
        for pid in _tree(proc.pid, procs) & procs.keys():
            last[pid] = (_kind(pid, proc.pid, procs[pid][2]), procs[pid][1])
            if last[pid][0] == "java":
                parent = procs.get(procs[pid][0], (0, 0, "?"))[2]
                jvms.setdefault(pid, [now, now, parent])[1] = now
        time.sleep(args.every)
    seconds: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for kind, ticks in last.values():
        seconds[kind] += ticks / _TICK
        count[kind] += 1
    print(f"wall {time.monotonic() - started:.1f} s, exit status {proc.returncode}, "
          f"CPU {sum(seconds.values()):.1f} s", file=sys.stderr)
    for kind, s in seconds.most_common():
        if s >= 0.05:
            print(f"  {s:8.1f} s  {count[kind]:4d} processes  {kind}", file=sys.stderr)
    if args.jvms:
        print("JVMs (CPU s, seen for s, parent):", file=sys.stderr)
        for pid, (first, seen, parent) in sorted(jvms.items(), key=lambda j: -last[j[0]][1]):
            print(f"  {last[pid][1] / _TICK:8.1f} s  {seen - first:7.1f} s  "
                  f"{' '.join(parent.split())[:90]}",
                  file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
