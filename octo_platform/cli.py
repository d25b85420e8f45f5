"""``octo``: run, check, explain, backfill, refresh, reset and demo streaming tables.

Exit codes: 0 success, 1 a run failed, 2 a bad project (SQL, unknown table) or usage.
"""
from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from octo_platform.errors import OctoError, RunError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from octo_platform.project import Project

__all__ = ["main"]


def _conf_pair(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--conf`` (the value may contain ``=``)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (e.g. "
                                         f"spark.sql.shuffle.partitions=8), got {text!r}")
    return key.strip(), value


def _parser() -> argparse.ArgumentParser:
    from octo_platform.runtime.driver import DEFAULT_DRIVER_ROWS, DEFAULT_DRIVER_STATE_ROWS
    from octo_platform.runtime.operators.arrow import DRIVER_BYTES

    p = argparse.ArgumentParser(prog="octo", description="Streaming SQL on Spark and Delta Lake")
    sub = p.add_subparsers(dest="command", required=True)

    def project_opts(sp: argparse.ArgumentParser, warehouse: bool = True) -> None:
        sp.add_argument("--project", default=".", help="project directory; its sql/ folder "
                        "holds the .sql files (default: current directory)")
        if warehouse:
            sp.add_argument("--warehouse", default=None, help="warehouse directory or URI "
                            "(default: <project>/warehouse)")

    def spark_opts(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--master", default=None, help="Spark master, e.g. spark://host:7077 "
                        "(default: spark.master of spark-defaults.conf, else local[2])")
        sp.add_argument("--conf", dest="conf", action="append", default=[], type=_conf_pair,
                        metavar="KEY=VALUE", help="a Spark setting (repeatable); beats "
                        "$SPARK_CONF_DIR/spark-defaults.conf, which beats octo's defaults")

    run = sub.add_parser("run", help="run streaming tables")
    run.add_argument("names", nargs="*", metavar="NAME", help="streaming tables to run (a "
                     "sink's name runs its table, which publishes it)")
    run.add_argument("--all", action="store_true", help="run every streaming table")
    run.add_argument("--until-idle", action="store_true",
                     help="process everything available, then exit 0")
    run.add_argument("--buckets", type=int, default=None,
                     help="state buckets of a new table (default: its buckets option, else "
                     "twice the session's cores, at least 8); a table keeps those it was "
                     "created with")
    run.add_argument("--driver-rows", type=int, default=DEFAULT_DRIVER_ROWS, metavar="N",
                     help="batches of at most N input rows, and sink batches of at most N "
                     "events, run in the driver, with no Spark job (but one to read CSV or "
                     f"delta inputs), when their input is at most {DRIVER_BYTES >> 20} MiB "
                     f"(default: {DEFAULT_DRIVER_ROWS}; 0: never)")
    run.add_argument("--driver-state-rows", type=int, default=DEFAULT_DRIVER_STATE_ROWS,
                     metavar="N", help="a table's batches run in the driver (--driver-rows) "
                     "only while the state they would hold there (operator state and "
                     "current-state rows) is at most N rows; above, they run as Spark jobs "
                     "(default: an eighth of this machine's memory at 150 bytes a row, "
                     f"here {DEFAULT_DRIVER_STATE_ROWS})")
    run.add_argument("--interval", default="1 second",
                     help="trigger interval of a continuous run (default: 1 second)")
    run.add_argument("--parallel", type=int, default=3,
                     help="with --until-idle: tables run at once, upstream first (default: 3)")
    project_opts(run)
    spark_opts(run)

    check = sub.add_parser("check", help="check every table of a project, running nothing: "
                           "its SQL, that Spark has each function called, that Spark can "
                           "analyse each expression over the declared types")
    project_opts(check, warehouse=False)
    spark_opts(check)

    explain = sub.add_parser("explain", help="print the logical and physical plan of a table")
    explain.add_argument("name", metavar="NAME")
    project_opts(explain, warehouse=False)

    backfill = sub.add_parser(
        "backfill", help="recompute a table from the input it has read and publish the "
        "difference as change events (downstream tables see corrections)")
    backfill.add_argument("name", metavar="NAME")
    backfill.add_argument("--from", dest="first", default=None, metavar="KEY",
                          help="first partition to recompute (a partitioned table; e.g. "
                          "2026-11-20); without it the whole table is recomputed")
    backfill.add_argument("--to", dest="last", default=None, metavar="KEY",
                          help="last partition to recompute, included (default: --from)")
    project_opts(backfill)
    spark_opts(backfill)

    refresh = sub.add_parser("refresh", help="full refresh: reset tables and everything "
                             "downstream of them, then rebuild them from all input")
    refresh.add_argument("names", nargs="+", metavar="NAME")
    project_opts(refresh)
    spark_opts(refresh)

    rescale = sub.add_parser("rescale", help="move a table's operator state and current "
                             "state to another number of buckets (each a task's unit of "
                             "work), as one batch that changes no row")
    rescale.add_argument("name", metavar="NAME")
    rescale.add_argument("--buckets", type=int, required=True, metavar="N",
                         help="the new number of buckets (1 to 4096; e.g. twice the "
                         "cluster's cores)")
    project_opts(rescale)
    spark_opts(rescale)

    reset = sub.add_parser("reset", help="delete a table's changelog, current state and "
                           "operator state so the next run rebuilds it from all input (its "
                           "sinks then publish it again from the start; a sink named alone "
                           "forgets what it published)")
    reset.add_argument("names", nargs="+", metavar="NAME")
    project_opts(reset)

    demo = sub.add_parser("demo", help="generate auction data in rounds and run the demo")
    demo.add_argument("--dir", default=None, help="where to create the demo project "
                      "(default: a fresh temporary directory)")
    demo.add_argument("--rounds", type=int, default=3)
    demo.add_argument("--kafka", action="store_true", help="the Kafka demo instead: Debezium "
                      "events in from a topic of a local broker (tansu), a sink topic out")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("run", "check", "backfill", "refresh", "rescale", "demo"):
        _quiet_query_context_logs()
    try:
        if args.command == "run":
            return _run(args)
        if args.command == "check":
            return _check(args)
        if args.command == "explain":
            from octo_platform.project import load_project

            print(load_project(args.project).explain(args.name))
            return 0
        if args.command == "reset":
            return _reset(args)
        if args.command == "backfill":
            return _backfill(args)
        if args.command == "refresh":
            return _refresh(args)
        if args.command == "rescale":
            return _rescale(args)
        if args.command == "demo" and args.kafka:
            from octo_platform.kafka_demo import run_kafka_demo

            run_kafka_demo(directory=args.dir, rounds=args.rounds)
            return 0
        if args.command == "demo":
            from octo_platform.demo import run_demo

            run_demo(directory=args.dir, rounds=args.rounds)
            return 0
    except RunError as e:
        print(f"octo: error: {e}", file=sys.stderr)
        return 1
    except OctoError as e:
        print(f"octo: error: {e}", file=sys.stderr)
        return 2
    return 2


def _quiet_query_context_logs() -> None:
    """PySpark logs every error of a SQL or DataFrame expression it raises as a JSON line
    with the Java stack trace (its ``SQLQueryContextLogger`` and
    ``DataFrameQueryContextLogger``), ~10 KB on stderr before octo's own one line, which
    names the table: the CLI leaves the error to that line."""
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True


def _session(args: argparse.Namespace, project: Project) -> SparkSession:
    """The session of ``--master`` and ``--conf`` (a later ``--conf`` of a key wins), able
    to read ``project``'s warehouse and sources (S3's connector when one is in S3). Its
    driver's JVM maps the class archive (``runtime/class_archive.py``) unless its options
    are set (``spark-defaults.conf``, ``--conf``): a one-batch ``octo run`` in a fresh
    process took 14.9 s with it, 18.2 s without (Spark's JIT and collector either way)."""
    from octo_platform.runtime.class_archive import driver_defaults
    from octo_platform.runtime.options import resolve_warehouse
    from octo_platform.runtime.session import spark_session

    conf = dict(args.conf)
    warehouse = resolve_warehouse(project.root, getattr(args, "warehouse", None))
    return spark_session(master=args.master, conf=conf, defaults=driver_defaults(conf),
                         uris=project.uris(warehouse))


def _run(args: argparse.Namespace) -> int:
    from octo_platform.project import load_project

    project = load_project(args.project)
    if not args.all and not args.names:
        print("octo: error: name streaming tables to run, or pass --all", file=sys.stderr)
        return 2
    # a sink's name runs its table (which publishes it); unknown names fail before Spark starts
    names = [project.sinks[n.lower()].table if n.lower() in project.sinks else
             project.table(n).name for n in args.names]
    from octo_platform.runtime.runner import run_tables
    from octo_platform.wiring import default_options

    spark = _session(args, project)
    report = run_tables(spark, project,
                        options=default_options(warehouse=args.warehouse, buckets=args.buckets,
                                                driver_rows=args.driver_rows,
                                                driver_state_rows=args.driver_state_rows),
                        names=None if args.all else names,
                        until_idle=args.until_idle, interval=args.interval,
                        parallel=args.parallel)
    total = len(report.batches)
    print(f"done: {total} batch(es), {report.dead_letters} dead letter(s)")
    return 0


def _check(args: argparse.Namespace) -> int:
    from octo_platform.project import load_project
    from octo_platform.runtime.checks import check_project

    project = load_project(args.project)
    check_project(_session(args, project), project, project.order())
    print(f"ok: {len(project.tables)} streaming table(s), {len(project.catalog.sources)} "
          f"source(s), {len(project.sinks)} sink(s)")
    return 0


def _reset(args: argparse.Namespace) -> int:
    from octo_platform.project import load_project
    from octo_platform.runtime.recompute import reset_tables

    reset_tables(load_project(args.project), args.names, warehouse=args.warehouse)
    return 0


def _backfill(args: argparse.Namespace) -> int:
    from octo_platform.project import load_project

    project = load_project(args.project)
    table = project.table(args.name)
    window = None
    if args.first is not None or args.last is not None:
        part = table.definition.partitioning
        if part is None:
            print(f"octo: error: streaming table {table.name!r} declares no partitions; "
                  "leave out --from/--to to recompute all of it", file=sys.stderr)
            return 2
        try:
            window = part.window(args.first or args.last, args.last or args.first)
        except ValueError as e:
            print(f"octo: error: {e}", file=sys.stderr)
            return 2
    from octo_platform.runtime.recompute import backfill
    from octo_platform.wiring import default_options

    report = backfill(_session(args, project), project, table.name,
                      options=default_options(warehouse=args.warehouse), window=window)
    if report.batch is not None:
        print(f"done: {report.rows_changed} row(s) changed in "
              f"{', '.join(report.partitions) or 'the table'}, published as batch "
              f"{report.batch.batch}")
    return 0


def _rescale(args: argparse.Namespace) -> int:
    from octo_platform.project import load_project
    from octo_platform.runtime.recompute import rescale
    from octo_platform.wiring import default_options

    project = load_project(args.project)
    table = project.table(args.name)  # an unknown name fails before Spark starts
    rescale(_session(args, project), project, table.name, args.buckets,
            options=default_options(warehouse=args.warehouse))
    return 0


def _refresh(args: argparse.Namespace) -> int:
    from octo_platform.project import load_project
    from octo_platform.runtime.recompute import refresh
    from octo_platform.wiring import default_options

    project = load_project(args.project)
    for name in args.names:
        project.table(name)  # unknown names fail before Spark starts
    report = refresh(_session(args, project), project, args.names,
                     options=default_options(warehouse=args.warehouse))
    print(f"done: {len(report.batches)} batch(es), {report.dead_letters} dead letter(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
