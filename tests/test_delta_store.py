"""``DeltaStore``'s open table handles: kept for the thread that opened them, passed on to
the process's next threads (each run's batches run on threads of their own), and never
trusted for a table made anew at the same path."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest

import state.delta
from state.delta import DeltaStore

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def opens(monkeypatch):
    """The versions asked of each fresh open of a table (``DeltaTable(...)``) from now on."""
    asked: list[int | None] = []

    class Counted(state.delta.DeltaTable):
        def __init__(self, *args, **kwargs):
            asked.append(kwargs.get("version"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(state.delta, "DeltaTable", Counted)
    return asked


def in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("value", fn()))
    t.start()
    t.join()
    return out["value"]


def test_a_later_thread_takes_the_handle_an_ended_thread_kept(tmp_path, opens):
    path, store = str(tmp_path / "t"), DeltaStore()
    for batch in range(3):
        in_thread(lambda b=batch: store.write(path, pa.table({"x": [b]}), app_id="a", batch=b))
    # the first write found no table and made it; the second opened it; the third's
    # thread took the handle the second's kept
    assert opens == [None, None]
    # a batch pins the version it reads: the newest, which the handle taken already has
    assert in_thread(lambda: store.num_rows(path, 2)) == 3
    assert opens == [None, None]
    # an older version is opened as asked, beside the kept handle
    assert in_thread(lambda: store.read(path, 1)).num_rows == 2
    assert opens == [None, None, 1]
    # a new store (the next run's) in a new thread: still no open of the newest version
    assert in_thread(lambda: DeltaStore().version(path)) == 2
    assert opens == [None, None, 1]


def test_a_table_made_anew_at_the_same_path_is_opened_afresh(tmp_path, opens):
    path, store = str(tmp_path / "t"), DeltaStore()
    for batch in range(2):
        in_thread(lambda b=batch: store.write(path, pa.table({"x": [b]}), app_id="a", batch=b))
    shutil.rmtree(path)
    store.write(path, pa.table({"x": [7, 8, 9]}), app_id="b", batch=0)
    # the pooled handle names a commit file that is no longer the one it read
    assert in_thread(lambda: store.read(path).column("x").to_pylist()) == [7, 8, 9]
    assert in_thread(lambda: store.done(path, app_id="a", batch=0)) is False


def test_a_process_that_read_a_table_exits_cleanly(tmp_path):
    """A read leaves no C++ thread holding a Python object: delta-rs's ``to_pyarrow_table``
    reads through a Python filesystem, and a process that had read a table that way aborted
    as it exited ("terminate called without an active exception", exit 134) 7 times in 10
    here, `make demo` 2 in 5. Eight processes in turn (side by side, on a busy machine,
    the same code aborted in none), each reading the table (by its path, or by a
    ``file://`` URI, as a remote table is read) and exiting."""
    path = str(tmp_path / "t")
    for batch in range(3):
        DeltaStore().write(path, pa.table({"x": [batch, -batch]}), app_id="a", batch=batch)
    code = ("import sys; from state.delta import DeltaStore; "
            "print(DeltaStore().read(sys.argv[1]).num_rows)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for where in [path, f"file://{path}"] * 4:
        done = subprocess.run([sys.executable, "-c", code, where], env=env, text=True,
                              capture_output=True, timeout=120)
        assert (done.returncode, done.stdout.strip()) == (0, "6"), done.stderr[-2000:]
