"""Each table is run by one process at a time: its lock, local or for a remote warehouse."""
from __future__ import annotations

import pytest

from octo_platform.errors import RunError
from octo_platform.runtime.layout import Layout
from octo_platform.runtime.locks import lock_path, lock_tables


def test_a_second_run_of_a_table_fails_at_once_and_a_remote_warehouse_locks_here(
        tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    local, remote = Layout(str(tmp_path / "wh")), Layout("s3://bucket/wh")
    for layout in (local, remote):
        with lock_tables(layout, ["a", "b"]):
            # a lock is an open file's: a second opening conflicts, in this process too
            with pytest.raises(RunError, match="'b' is being run by another process"):
                with lock_tables(layout, ["c", "b"]):
                    pass
            with lock_tables(layout, ["c"]):  # another table: free
                pass
        with lock_tables(layout, ["b"]):  # released
            pass
    assert lock_path(local, "a") == tmp_path / "wh" / "_octo" / "a" / "lock"
    # a remote table's lock is a file of this machine, named for the table's URI; nothing
    # is made in the working directory (it once made an `s3:` folder there)
    assert lock_path(remote, "a").parent == tmp_path / "cache" / "octo" / "locks"
    assert lock_path(remote, "a") != lock_path(Layout("s3://bucket/other"), "a")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "wh"]
