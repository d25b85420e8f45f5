"""Delta Lake IO through delta-rs: the only module that imports ``deltalake``.

Every write for micro-batch N carries the app transaction ``(app_id, N)`` and is skipped when
the table already holds it, which makes re-running a half-finished batch idempotent.
"""
from __future__ import annotations

import functools
import json
import os
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal
from urllib.parse import unquote

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, QueryBuilder, Schema, Transaction, \
    write_deltalake
from deltalake.exceptions import TableNotFoundError
from deltalake.fs import DeltaStorageHandler
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions
from pyarrow import fs

from octo_platform.errors import RunError

__all__ = ["DeltaStore", "DataFile"]

DataFile = dict[str, Any]  # {"path": relative, "size": bytes, "rows": n, "partition": {...}}
_SNAPSHOTS = 256  # snapshots' add actions kept per thread (DeltaStore._actions)
_POOLED = 256  # local tables' open handles kept for the process's next threads (_Held)
_POOL: OrderedDict[str, tuple[DeltaTable, Any]] = OrderedDict()
# Re-entrant: a thread's handles may be given back (``_Held``'s finalizer) by a garbage
# collection that starts while that same thread holds the lock.
_POOL_LOCK = threading.RLock()


def _check_sole_writer(path: str, dt: DeltaTable) -> None:
    """Refuse to commit to one of octo's tables that another writer turned deletion vectors
    or column mapping on for: delta-rs writes neither, and octo's own reads of the table's
    files would not apply them."""
    features = set(dt.protocol().reader_features or ())
    mapping = dt.metadata().configuration.get("delta.columnMapping.mode", "none")
    if "deletionVectors" in features or "columnMapping" in features or mapping != "none":
        raise RunError(
            f"the Delta table {path} has deletion vectors or column mapping turned on, which "
            "another writer (e.g. Spark's ALTER TABLE, DELETE, UPDATE or MERGE) set up: octo "
            "writes its tables with delta-rs alone, which writes neither, and cannot keep this "
            "table exact. Do not write octo's tables with another writer; run `octo reset "
            "<table>` to rebuild the streaming table (downstream tables: `octo refresh`).")


@functools.lru_cache(maxsize=64)
def _object_store(path: str, options: tuple[tuple[str, str], ...]) -> fs.PyFileSystem:
    """The file system of a table in object storage, made once per process and table: a
    ``DeltaStorageHandler`` builds its object-store client when made, which took 3-4 times
    as long as writing a state bucket's file to a local S3 server (moto) in a Spark task."""
    return fs.PyFileSystem(DeltaStorageHandler(path, dict(options) or None))


def _options(storage_options: dict[str, str] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((storage_options or {}).items()))


def _open_output(storage_options: dict[str, str] | None, path: str,
                 relative: str) -> pa.NativeFile:
    """A new file ``relative`` inside the table directory ``path``, open for writing."""
    if "://" not in path:
        target = os.path.join(path, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        return fs.LocalFileSystem().open_output_stream(target)
    return _object_store(path, _options(storage_options)).open_output_stream(relative)


def _open_input(storage_options: dict[str, str] | None, path: str,
                relative: str) -> pa.NativeFile:
    """Data file ``relative`` (as ``data_files`` names it) of the table at ``path``."""
    if "://" not in path:
        return fs.LocalFileSystem().open_input_file(os.path.join(path, unquote(relative)))
    return _object_store(path, _options(storage_options)).open_input_file(relative)


def _scan(dt: DeltaTable, sql: str) -> pa.Table:
    """``sql`` over the table ``dt`` (named ``t``), run by delta-rs's own engine. Not
    ``to_pyarrow_table``: it reads through a Python filesystem (``DeltaStorageHandler``),
    and Arrow's threads take the GIL to drop their last reference to it; one that does so
    while the interpreter exits aborts the process ("terminate called without an active
    exception", exit 134: delta-rs#2184, apache/arrow#34314). A process that read a table
    that way and exited aborted 7 times in 10 here (a local path; 5 in 10 by a
    ``file://`` URI), `make demo` 2 in 5."""
    return pa.table(QueryBuilder().register("t", dt).execute(sql).read_all())


def _nullable(table: pa.Table) -> pa.Table:
    """Mark every field nullable so batches whose nullability differs share one schema."""

    def relax(t: pa.DataType) -> pa.DataType:
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, relax(f.type), True) for f in t])
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return pa.list_(pa.field(t.value_field.name, relax(t.value_type), True))
        return t

    schema = pa.schema([pa.field(f.name, relax(f.type), True) for f in table.schema])
    return table.cast(schema) if schema != table.schema else table


def _commit_stamp(path: str, version: int) -> tuple[int, int] | None:
    """Identity of a local table's commit file of ``version`` (None: it is gone, or the
    table is in object storage)."""
    if "://" in path:
        return None
    try:
        st = os.stat(os.path.join(path, "_delta_log", f"{version:020d}.json"))
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _file_uri(path: str, base: str, rel: str) -> str:
    """A data file's URI from its add action's ``rel``ative path. For a local table:
    ``file://`` and the decoded absolute path, which Hadoop and pyarrow both read as it is
    (a percent-encoded one, e.g. of a directory with a space, Hadoop would encode again);
    else ``base`` (the table URI) joined with the encoded path."""
    if "://" in rel:
        return rel
    if "://" not in path:
        return "file://" + os.path.join(os.path.abspath(path), unquote(rel))
    return f"{base}/{rel}"


def _newer(path: str, version: int) -> bool:
    """Whether the table may have commits after ``version``: for a local table, whether
    the next commit file exists (one ``stat``, where an update of the handle lists the log)."""
    return "://" in path or os.path.exists(
        os.path.join(path, "_delta_log", f"{version + 1:020d}.json"))


def _give_back(tables: dict[str, tuple[DeltaTable, Any]]) -> None:
    with _POOL_LOCK:
        for path, kept in tables.items():
            _POOL[path] = kept
            _POOL.move_to_end(path)
        while len(_POOL) > _POOLED:
            _POOL.popitem(last=False)
    tables.clear()


def _pooled(path: str) -> tuple[DeltaTable, Any] | None:
    with _POOL_LOCK:
        return _POOL.pop(path, None)


class _Held:
    """The handles one thread holds (path -> (handle, commit stamp)). When the thread ends
    (or its store goes), they go to the process's pool, from which the next thread to open
    the table takes it: each run's batches run on threads of their own, and a table opened
    afresh cost ~20-30 ms here (14 per first batch of a join and two aggregates)."""

    def __init__(self) -> None:
        self.tables: dict[str, tuple[DeltaTable, Any]] = {}
        weakref.finalize(self, _give_back, self.tables)


class DeltaStore:
    """Reads and idempotent writes of the Delta tables under a warehouse.

    A table's handle is kept open per thread (a pipeline runs its batches on one
    thread; a handle is never used by two threads at once), passed on to later threads
    (``_Held``), and brought up to date incrementally before each use: a full open reads and
    replays the whole log (~8 ms here; in object storage a listing and a read per commit
    since the last checkpoint), an update only the new commits (~0.4 ms; in object storage
    a listing), and for a local table none is made when the next commit file is not there.
    A local table's handle
    whose newest commit file is no longer the one it read (the table was deleted and made
    again, e.g. by ``octo reset``) is dropped and the table opened afresh.
    """

    def __init__(self, storage_options: dict[str, str] | None = None) -> None:
        self.storage_options = storage_options or None
        self._handles = threading.local()

    def _open(self, path: str, version: int | None = None) -> DeltaTable | None:
        handles = self._held().tables
        kept = handles.get(path)
        if kept is None and (kept := _pooled(path)) is not None:
            handles[path] = kept
        if kept is not None and _commit_stamp(path, kept[0].version()) != kept[1]:
            del handles[path]  # made again since (or its commit cleaned up): open afresh
            kept = None
        if kept is not None:
            dt = kept[0]
            if (version is None or version > dt.version()) and _newer(path, dt.version()):
                dt.update_incremental()
                handles[path] = (dt, _commit_stamp(path, dt.version()))
            if version is None or dt.version() == version:
                return dt
        try:
            if kept is None:
                # a table is opened at its newest version and kept, which is the version
                # asked for most of the time (a batch pins the versions it reads)
                dt = DeltaTable(path, storage_options=self.storage_options)
                handles[path] = (dt, _commit_stamp(path, dt.version()))
                if version is None or version == dt.version():
                    return dt
            return DeltaTable(path, version=version, storage_options=self.storage_options)
        except TableNotFoundError:  # no table, or (a version given) no log of that version
            return None

    def _held(self) -> _Held:
        held = getattr(self._handles, "held", None)
        if held is None:
            held = self._handles.held = _Held()
        return held

    def _actions(self, path: str, version: int) -> tuple[pa.Table, str] | None:
        """The add actions (flattened) of a snapshot and the table's URI; None when there is
        no table. A
        snapshot never changes, so each thread keeps the last ``_SNAPSHOTS`` it read (a
        local table's entry is checked against its commit file, as handles are)."""
        memo: dict[tuple[str, int], tuple[tuple[pa.Table, str], Any]] = \
            self._handles.__dict__.setdefault("actions", {})
        key = (path, version)
        local = "://" not in path
        kept = memo.pop(key, None)
        if kept is not None and (not local or _commit_stamp(path, version) == kept[1]):
            memo[key] = kept  # most recently used last
            return kept[0]
        dt = self._open(path, version)
        if dt is None:
            return None
        actions = (pa.table(dt.get_add_actions(flatten=True)), dt.table_uri.rstrip("/"))
        memo[key] = (actions, _commit_stamp(path, version) if local else None)
        while len(memo) > _SNAPSHOTS:
            memo.pop(next(iter(memo)))
        return actions

    def version(self, path: str) -> int | None:
        """Current version of the table at ``path``, None if there is no table."""
        dt = self._open(path)
        return None if dt is None else dt.version()

    def files(self, path: str, version: int | None,
              partitions: set[int] | None = None) -> list[str]:
        """Data file URIs of a snapshot, optionally only those of some ``_bucket`` partitions."""
        files = self.data_files(path, version)
        if partitions is None or not files or "_bucket" not in files[0]["partition"]:
            return [f["uri"] for f in files]
        return [f["uri"] for f in files
                if f["partition"]["_bucket"] is not None
                and int(f["partition"]["_bucket"]) in partitions]

    def data_files(self, path: str, version: int | None) -> list[DataFile]:
        """The data files of a snapshot: ``uri``, ``path`` (relative), ``rows``, ``size``
        and ``partition`` (the ``_bucket`` value, when the table has that column)."""
        snapshot = None if version is None else self._actions(path, version)
        if snapshot is None or not snapshot[0].num_rows:
            return []
        actions, base = snapshot
        col = "partition._bucket"
        buckets = (actions.column(col).to_pylist() if col in actions.column_names
                   else None)
        return [{"uri": _file_uri(path, base, rel), "path": rel, "rows": rows,
                 "size": size, "partition": {} if buckets is None else {"_bucket": buckets[i]}}
                for i, (rel, rows, size) in enumerate(zip(
                    actions.column("path").to_pylist(),
                    actions.column("num_records").to_pylist(),
                    actions.column("size_bytes").to_pylist()))]

    def added_files(self, path: str, from_version: int | None, to_version: int) -> list[str]:
        """Files in ``to_version`` that were not in ``from_version`` (append-only tables)."""
        before = set(self.files(path, from_version)) if from_version is not None else set()
        return sorted(f for f in self.files(path, to_version) if f not in before)

    def num_rows(self, path: str, version: int | None = None) -> int | None:
        """Rows in a snapshot, from the file statistics of the Delta log (no data read);
        None when there is no table."""
        version = self.version(path) if version is None else version
        if version is None or self._actions(path, version) is None:
            return None
        files = self.data_files(path, version)
        if any(f["rows"] is None for f in files):  # a writer without statistics: count them
            return _scan(self._open(path, version), "SELECT COUNT(*) AS n FROM t")[0][0].as_py()
        return sum(int(f["rows"]) for f in files)

    def read(self, path: str, version: int | None = None) -> pa.Table | None:
        dt = self._open(path, version)
        if dt is None:
            return None
        schema = pa.schema(dt.schema().to_arrow())
        return _scan(dt, "SELECT * FROM t").select(schema.names).cast(schema)

    def write(self, path: str, data: pa.Table, *, app_id: str, batch: int) -> int | None:
        """Append ``data`` (a small table built on the driver, e.g. a batch-log row) as batch
        ``batch`` of ``app_id``; the table version afterwards. Skipped (nothing written) when
        the table already holds that batch. Batch data goes through ``commit`` instead."""
        dt = self._open(path)
        if dt is not None:
            _check_sole_writer(path, dt)
            done = dt.transaction_version(app_id)
            if done is not None and int(done) >= batch:
                return dt.version()
        elif "://" not in path:
            os.makedirs(path, exist_ok=True)
        write_deltalake(
            dt if dt is not None else path,
            _nullable(data),
            mode="append",
            storage_options=None if dt is not None else self.storage_options,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id=app_id, version=batch)]
            ),
        )
        if dt is None:
            return 0
        # Single writer per table (the runner holds a lock); writing updated the handle, so
        # it is kept with its new commit file's stamp (else the next use would reopen it).
        self._held().tables[path] = (dt, _commit_stamp(path, dt.version()))
        return dt.version()

    def done(self, path: str, *, app_id: str, batch: int) -> bool:
        """Whether the table already holds batch ``batch`` of ``app_id``."""
        dt = self._open(path)
        done = None if dt is None else dt.transaction_version(app_id)
        return done is not None and int(done) >= batch

    def opener(self) -> Callable[[str, str], pa.NativeFile]:
        """A picklable ``open(table_path, relative_path)`` for executors: data files are
        written where the data is, and only their names travel to the driver's commit."""
        return functools.partial(_open_output, self.storage_options)

    def reader(self) -> Callable[[str, str], pa.NativeFile]:
        """A picklable ``open(table_path, relative_path)`` of data files, for executors."""
        return functools.partial(_open_input, self.storage_options)

    def commit(
        self,
        path: str,
        files: list[DataFile],
        *,
        schema: pa.Schema,
        app_id: str,
        batch: int,
        partition_by: list[str] | None = None,
        replace: set[int] | Literal["all"] | None = None,
        remove: tuple[str, ...] = (),
    ) -> int | None:
        """Commit data files already written into the table directory as batch ``batch``
        of ``app_id``, in one Delta commit; the table version afterwards.

        ``replace`` removes, in the same commit, every file of those ``_bucket`` partitions
        (``"all"``: every file); ``remove`` names more files to remove (relative paths, as
        ``data_files`` gives them). Skipped when the table already holds the batch; a table
        that does not exist is created (also with no files)."""
        dt = self._open(path)
        if dt is not None:
            _check_sole_writer(path, dt)
            done = dt.transaction_version(app_id)
            if done is not None and int(done) >= batch:
                return dt.version()
        now = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(f["path"], int(f["size"]),
                      {k: None if v is None else str(v) for k, v in f["partition"].items()},
                      now, True, json.dumps({"numRecords": int(f["rows"])}))
            for f in files]
        props = CommitProperties(app_transactions=[Transaction(app_id=app_id, version=batch)])
        delta_schema = Schema.from_arrow(_nullable(schema.empty_table()).schema)
        if dt is None:
            if "://" not in path:
                os.makedirs(path, exist_ok=True)
            create_table_with_add_actions(path, delta_schema, actions, mode="append",
                                          partition_by=partition_by,
                                          storage_options=self.storage_options,
                                          commit_properties=props)
            return 0
        if replace is not None or remove:
            actions += self._removals(self.data_files(path, dt.version()), replace,
                                      set(remove), now)
        if not actions:
            return dt.version()
        dt.create_write_transaction(actions, "append", delta_schema, partition_by=partition_by,
                                    commit_properties=props)
        return dt.version() + 1

    @staticmethod
    def _removals(files: list[DataFile], replace: set[int] | Literal["all"] | None,
                  remove: set[str], now: int) -> list[RemoveAction]:
        out = []
        for f in files:
            bucket = f["partition"].get("_bucket")
            if replace == "all" or f["path"] in remove \
                    or (replace is not None and bucket is not None and int(bucket) in replace):
                out.append(RemoveAction(f["path"], True, now, f["size"],
                                        {} if bucket is None else {"_bucket": str(bucket)}))
        return out

    def compact(self, path: str, *, rewrite: bool) -> None:
        """Drop files no longer in the current version; with ``rewrite``, first merge small
        files (``optimize``). Only call it when no reader needs an older version."""
        dt = self._open(path)
        if dt is None:
            return
        if rewrite:
            dt.optimize.compact()
        dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)

    def arrow_schema(self, path: str) -> pa.Schema | None:
        dt = self._open(path)
        return None if dt is None else pa.schema(dt.schema().to_arrow())

    # -- Delta tables written by others (the ``delta`` source connector) --------------------
    def table_info(self, path: str, version: int | None = None) -> dict[str, Any] | None:
        """``version``, arrow ``schema``, ``partition_columns``, ``configuration`` (table
        properties), ``reader_features`` and the table's ``id`` (made with the table) of a
        version (default: the latest); None when there is no table or no such version."""
        dt = self._open(path, version)
        if dt is None:
            return None
        meta = dt.metadata()
        return {"version": dt.version(), "id": meta.id,
                "schema": pa.schema(dt.schema().to_arrow()),
                "partition_columns": list(meta.partition_columns),
                "configuration": dict(meta.configuration),
                "reader_features": list(dt.protocol().reader_features or [])}

    def snapshot(self, path: str, version: int) -> tuple[list[str], pa.Table] | None:
        """Data file URIs of a version and their partition values (one row per file, same
        order); None when the version cannot be loaded (no table, or its log was removed)."""
        dt = self._open(path, version)
        if dt is None:
            return None
        actions = pa.table(dt.get_add_actions(flatten=True))
        base = dt.table_uri.rstrip("/")
        uris = [_file_uri(path, base, rel) for rel in actions.column("path").to_pylist()]
        parts = [c for c in actions.column_names if c.startswith("partition.")]
        return uris, actions.select(parts).rename_columns(
            [c.removeprefix("partition.") for c in parts])

    def missing_files(self, path: str, uris: list[str]) -> list[str]:
        """Those of ``uris`` (files of the table at ``path``) that no longer exist (vacuumed)."""
        if "://" not in path:
            return [u for u in uris if not os.path.exists(u.removeprefix("file://"))]
        dt = self._open(path)
        if dt is None:
            return list(uris)
        base = dt.table_uri.rstrip("/") + "/"
        inside = [u for u in uris if u.startswith(base)]
        handler = _object_store(dt.table_uri, _options(self.storage_options))
        infos = handler.get_file_info([u[len(base):] for u in inside])
        return [u for u, i in zip(inside, infos) if i.type == fs.FileType.NotFound]

    def change_data(self, path: str, from_version: int, to_version: int) -> pa.Table | None:
        """Change data feed of the commits after ``from_version`` up to ``to_version``: the
        table's columns plus ``_change_type``. None when it cannot be read (files vacuumed)."""
        dt = self._open(path, to_version)
        if dt is None:
            return None
        try:
            got = pa.table(dt.load_cdf(starting_version=from_version + 1,
                                       ending_version=to_version).read_all())
        except Exception:  # noqa: BLE001 - vacuumed files or log: the caller falls back
            return None
        columns = {f.name: got.column(f.name).cast(f.type)
                   for f in pa.schema(dt.schema().to_arrow())}
        return pa.table({**columns, "_change_type": got.column("_change_type").cast(pa.string())})

