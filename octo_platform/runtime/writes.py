"""The data path: executors write a batch's Parquet files, the driver commits them.

All tables a batch changes (changelog, current state, operator state) are written by ONE
Spark job: their rows are tagged with their output and unioned, and a ``mapInArrow`` task
writes each output's rows (per ``_bucket``) into the output table's directory with Arrow.
Only file names, sizes and row counts come back to the driver, which then makes one Delta
commit per table carrying the app transaction ``(octo, N)``. Files of an attempt that dies
before its commit are in no Delta version, so readers never see them (vacuum drops them).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Literal

from octo_platform.runtime.columns import BUCKET
from octo_platform.runtime.offsets import Store

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["Output", "write_outputs"]

APP_ID = "octo"
_FILE_SCHEMA = "o INT, path STRING, size BIGINT, rows BIGINT, bucket INT"


@dataclass(frozen=True)
class Output:
    """Rows for one Delta table of the batch.

    ``bucketed``: the table is partitioned by ``_bucket`` (a column of ``frame``);
    ``replace``: buckets whose files the commit removes (``"all"``: the whole table), None
    to append."""

    key: str
    path: str
    frame: DataFrame
    bucketed: bool = False
    replace: set[int] | Literal["all"] | None = None


def write_outputs(outputs: list[Output], *, batch: int, store: Store) -> dict[str, int | None]:
    """Write and commit ``outputs`` as batch ``batch``; each table's version afterwards.

    Tables that already hold the batch (a half-finished earlier attempt) are left alone."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import to_arrow_schema

    todo = [o for o in outputs if not store.done(o.path, app_id=APP_ID, batch=batch)]
    versions = {o.key: store.version(o.path) for o in outputs if o not in todo}
    if not todo:
        return versions
    schemas = [to_arrow_schema(o.frame.schema, timezone="UTC") for o in todo]
    tagged = []
    for i, o in enumerate(todo):
        cols = [F.lit(i).alias("_o")]
        for j, other in enumerate(todo):
            value = F.struct(*[F.col(f"`{c}`") for c in o.frame.columns]) if i == j else \
                F.lit(None).cast(_struct_type(other.frame))
            cols.append(value.alias(f"o{j}"))
        tagged.append(o.frame.select(*cols))
    union = tagged[0]
    for t in tagged[1:]:
        union = union.unionAll(t)
    meta = [(o.path, o.bucketed, schemas[i]) for i, o in enumerate(todo)]
    token = f"b{batch:08d}-{uuid.uuid4().hex[:12]}"
    files = union.mapInArrow(_writer(meta, token, store), _FILE_SCHEMA).collect()
    for i, o in enumerate(todo):
        mine = [{"path": f.path, "size": f.size, "rows": f.rows,
                 "partition": {BUCKET: f.bucket} if o.bucketed else {}}
                for f in files if f.o == i]
        versions[o.key] = store.commit(o.path, mine, schema=schemas[i], app_id=APP_ID,
                                       batch=batch,
                                       partition_by=[BUCKET] if o.bucketed else None,
                                       replace=o.replace)
    return versions


def _struct_type(frame: DataFrame) -> Any:
    from pyspark.sql.types import StructType

    return StructType(frame.schema.fields)


def _writer(meta: list[tuple[str, bool, pa.Schema]], token: str, store: Store):
    """The ``mapInArrow`` function: rows of output ``i`` go to Parquet files under
    ``meta[i]``'s table path (one file per output and bucket per task); yields one row per
    file written. Runs on executors."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        task = uuid.uuid4().hex[:8]
        open_files: dict[tuple[int, int | None], tuple[Any, Any, str]] = {}
        counts: dict[tuple[int, int | None], int] = {}

        def sink(i: int, bucket: int | None, rows: pa.Table) -> None:
            key = (i, bucket)
            if key not in open_files:
                path = meta[i][0]
                rel = f"{token}-{task}-{i}.parquet"
                if bucket is not None:
                    rel = f"{BUCKET}={bucket}/{rel}"
                stream = store.open_output(path, rel)
                open_files[key] = (pq.ParquetWriter(stream, rows.schema), stream, rel)
                counts[key] = 0
            open_files[key][0].write_table(rows)
            counts[key] += rows.num_rows

        for rb in batches:
            tags = rb.column("_o")
            for i in pc.unique(tags).to_pylist():
                _, bucketed, schema = meta[i]
                part = rb.filter(pc.equal(tags, i)).column(f"o{i}")
                rows = pa.Table.from_batches([pa.RecordBatch.from_struct_array(part)])
                rows = rows.cast(schema)
                if not bucketed:
                    sink(i, None, rows)
                    continue
                buckets = rows.column(BUCKET)
                data = rows.drop_columns([BUCKET])
                for b in pc.unique(buckets).to_pylist():
                    sink(i, b, data.filter(pc.equal(buckets, b)))
        out = {"o": [], "path": [], "size": [], "rows": [], "bucket": []}
        for (i, bucket), (writer, stream, rel) in open_files.items():
            writer.close()
            size = stream.tell()
            stream.close()
            for k, v in zip(out, (i, rel, size, counts[(i, bucket)], bucket)):
                out[k].append(v)
        yield pa.RecordBatch.from_pydict(out, schema=pa.schema([
            ("o", pa.int32()), ("path", pa.string()), ("size", pa.int64()),
            ("rows", pa.int64()), ("bucket", pa.int32())]))

    return write
