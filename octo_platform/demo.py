"""``octo demo``: the repo's example project, fed with generated auction data in rounds.

Each round writes new Nexmark-style input files (bids, auctions, persons and a Debezium CDC
feed of auctions), runs every streaming table until idle, and prints each table's current
result and a sample of the change events its latest batch produced.

Like the CLI, this is an entry point that wires the edges together, so it may import
``connectors`` and ``state`` (inside functions, to keep ``import octo_platform`` light).
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from octo_platform.errors import OctoError

if TYPE_CHECKING:
    import pyarrow as pa

    from octo_platform.runtime.runner import RunReport

__all__ = ["run_demo", "repo_sql_dir"]

MAX_ROWS = 8  # rows of each table's current result to print
MAX_EVENTS = 5  # change events of the latest batch to print
BUCKET_COLUMN = "_bucket"  # partition column of the current-state snapshot (not user data)
_OP_ORDER = ("u", "d", "c", "r")  # sample updates first: they show retractions at work


def repo_sql_dir() -> Path:
    """The example ``sql/`` folder of the repository this package was installed from."""
    return Path(__file__).resolve().parents[1] / "sql"


def run_demo(*, directory: str | None = None, rounds: int = 3) -> None:
    """Create a demo project in ``directory`` (default: a fresh temp dir) and run ``rounds``."""
    from connectors.generators.nexmark import NexmarkGenerator, demo_round
    from octo_platform.project import load_project
    from octo_platform.runtime.runner import run_tables
    from octo_platform.runtime.class_archive import driver_defaults
    from octo_platform.runtime.session import spark_session
    from octo_platform.wiring import default_options

    if rounds < 1:
        raise OctoError(f"--rounds must be at least 1 (got {rounds})")
    started = time.monotonic()
    project_dir = _create_project(directory)
    project = load_project(project_dir)
    options = default_options(progress=None)
    layout = options.layout(project.root)
    # Shown by file (so by group); run_tables itself runs upstream tables first.
    tables = sorted((t.name for t in project.order()),
                    key=lambda n: (project.table(n).definition.file, n))
    print(f"demo project: {project_dir}")
    print(f"streaming tables ({len(tables)}): {', '.join(tables)}")
    print("starting Spark ...", flush=True)
    spark = spark_session(defaults=driver_defaults({}, quick=True))
    store = options.env.store
    generator = NexmarkGenerator()
    for round_no in range(rounds):
        counts = demo_round(project_dir, round_no=round_no, generator=generator)
        inputs = ", ".join(f"+{counts[k]} {k}" for k in ("persons", "auctions", "bids"))
        print(f"\n{'=' * 100}\nRound {round_no + 1}/{rounds}: new input files with {inputs} and "
              f"{counts['auctions_cdc']} auctions_cdc change events\n{'=' * 100}", flush=True)
        t0 = time.monotonic()
        report = run_tables(spark, project, options=options, until_idle=True)
        print(f"ran {len(report.batches)} batch(es) in {time.monotonic() - t0:.1f}s: "
              + ", ".join(f"{b.table} {b.seconds:.1f}s" for b in report.batches))
        for name in tables:
            about = f"{project.table(name).definition.file}: {_summary(project, name)}"
            _show_table(store, layout, name, report, about if round_no == 0 else "")
    print(f"\n{'=' * 100}\ndone in {time.monotonic() - started:.0f}s")
    _print_next_steps(project_dir, layout.warehouse)


def _create_project(directory: str | None) -> Path:
    source = repo_sql_dir()
    if not source.is_dir():
        raise OctoError(
            f"the example SQL folder {source} is missing: `octo demo` needs the repository "
            "checkout (install it with `pip install -e .` from the repo)")
    if directory is None:
        root = Path(tempfile.mkdtemp(prefix="octo-demo-"))
    else:
        root = Path(directory).resolve()
        if root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise OctoError(f"demo directory {root} exists and is not an empty directory: the "
                            "demo writes fresh input, so pick a new directory (or delete it)")
        root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, root / "sql", ignore=shutil.ignore_patterns("__pycache__", ".*"))
    return root


# -- printing -------------------------------------------------------------------------------
def _summary(project: Any, name: str) -> str:
    """The first line of the comment at the top of the table's SQL file."""
    path = project.root / project.table(name).definition.file
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if text.startswith("--") and text.strip("- "):
            return text.lstrip("-").strip()
        if text and not text.startswith("--"):
            break
    return ""


def _show_table(store: Any, layout: Any, name: str, report: RunReport, about: str) -> None:
    current = store.read(layout.current(name))
    batches = report.for_table(name)
    events = "".join(
        f", batch {b.batch}: {b.rows_in} rows in -> "
        + " ".join(f"{op}={b.events.get(op, 0)}" for op in ("c", "u", "d"))
        for b in batches) or ", no new batch"
    rows = _rows(current)
    print(f"\n--- {name} ({len(rows)} row{'s' if len(rows) != 1 else ''}{events})")
    if about:
        print(f"  [{about}]")
    if current is not None:
        columns = [c for c in current.column_names if c != BUCKET_COLUMN]
        print(_grid(columns, rows))
    if not batches:
        return
    latest = batches[-1].batch
    events_of_batch = _events_of(store.read(layout.changelog(name)), latest)
    if not events_of_batch:
        print(f"  no changes in batch {latest}")
        return
    sample = _sample(events_of_batch)
    shown = "" if len(sample) == len(events_of_batch) else f", {len(sample)} shown"
    n = len(events_of_batch)
    print(f"  changes in batch {latest} ({n} event{'s' if n != 1 else ''}{shown}):")
    for op, before, after in sample:
        print("    " + _event_line(op, before, after))


def _rows(table: pa.Table | None) -> list[tuple[Any, ...]]:
    if table is None:
        return []
    columns = [c for c in table.column_names if c != BUCKET_COLUMN]
    data = table.select(columns).to_pylist()
    rows = [tuple(r[c] for c in columns) for r in data]
    return sorted(rows, key=lambda r: tuple(_sort_key(v) for v in r))


def _sort_key(value: Any) -> tuple[int, Any]:
    # NULLs last; mixed types cannot occur within one column.
    return (1, 0) if value is None else (0, value)


def _grid(columns: list[str], rows: list[tuple[Any, ...]]) -> str:
    shown = [[_fmt(v) for v in r] for r in rows[:MAX_ROWS]]
    widths = [max([len(c), *(len(r[i]) for r in shown)]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(r[i], (int, float)) or r[i] is None for r in rows[:MAX_ROWS])
               for i in range(len(columns))]

    def line(cells: list[str]) -> str:
        return "  " + "  ".join(c.rjust(w) if num else c.ljust(w)
                                for c, w, num in zip(cells, widths, numeric)).rstrip()

    out = [line(columns), line(["-" * w for w in widths])]
    out.extend(line(r) for r in shown)
    if len(rows) > MAX_ROWS:
        out.append(f"  ... {len(rows) - MAX_ROWS} more row(s)")
    return "\n".join(out)


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else repr(value)
    return str(value)


def _events_of(changelog: pa.Table | None, batch: int) -> list[dict[str, Any]]:
    if changelog is None or not len(changelog):
        return []
    import pyarrow.compute as pc

    batch_ids = pc.struct_field(changelog.column("source"), "batch_id")
    events = changelog.filter(pc.equal(batch_ids, batch))
    return events.select(["op", "before", "after"]).to_pylist()


def _sample(events: list[dict[str, Any]]) -> list[tuple[str, dict | None, dict | None]]:
    """Up to MAX_EVENTS events, taking the ops in turn (u, d, c, r) so the sample shows each."""
    by_op: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_op.setdefault(e["op"], []).append(e)
    for op in by_op:
        by_op[op].sort(key=_row_key)
    queues = [by_op.get(op, []) for op in _OP_ORDER]
    out: list[tuple[str, dict | None, dict | None]] = []
    while len(out) < MAX_EVENTS and any(queues):
        for q in queues:
            if q and len(out) < MAX_EVENTS:
                e = q.pop(0)
                out.append((e["op"], e["before"], e["after"]))
    return out


def _row_key(event: dict[str, Any]) -> tuple:
    row = event["after"] or event["before"] or {}
    return tuple(_sort_key(v) for v in row.values())


def _event_line(op: str, before: dict | None, after: dict | None) -> str:
    if op == "u":
        return f"u  {_image(before)} -> {_image(after)}"
    if op == "d":
        return f"d  {_image(before)}"
    return f"{op}  {_image(after)}"


def _image(row: dict[str, Any] | None) -> str:
    if row is None:
        return "null"
    return "{" + ", ".join(f"{k}: {_fmt(v)}" for k, v in row.items()) + "}"


def _print_next_steps(project_dir: Path, warehouse: str) -> None:
    d, table = str(project_dir), f"{warehouse}/bid_histogram"
    print(f"""
warehouse: {warehouse}
  <table>/            Delta changelog of each streaming table (op, before, after, ts_ms, source)
  _current/<table>/   Delta current-state snapshot of each table
  _octo/<table>/      operator state and the batch log of each table

try:
  octo explain bid_histogram --project {d}
  octo run --all --until-idle --project {d}   # picks up new files under data/

  # any Delta reader works, e.g. deltalake (delta-rs) and DuckDB (pip install duckdb):
  python -c "from deltalake import DeltaTable; print(DeltaTable('{table}').to_pandas())"
  python -c "import duckdb; from deltalake import DeltaTable; \\
t = DeltaTable('{table}').to_pyarrow_dataset(); \\
duckdb.sql('SELECT source.batch_id, op, before, after FROM t ORDER BY 1, 2').show()"
  # or, with DuckDB's delta extension: SELECT * FROM delta_scan('{table}')
  # or Spark's Delta reader, in the session octo builds (Delta Lake included):
  python -c "from octo_platform.runtime.session import spark_session; \\
spark_session().read.format('delta').load('{table}').show()\"""")
