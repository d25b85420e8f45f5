"""How a project's sources and streaming tables become Dagster assets (dagster-dbt's
``DagsterDbtTranslator`` shape).

Every asset, check, job, schedule and sensor of the code location asks one translator for
asset keys and groups, so a user's subclass changes them everywhere at once::

    class Prefixed(OctoTranslator):
        def get_asset_key(self, name: str) -> dg.AssetKey:
            return dg.AssetKey(["streaming", name])

    defs = build_definitions("my_project", translator=Prefixed())
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import dagster as dg

from octo_platform.logical.lineage import column_lineage
from octo_platform.logical.plan import explain as explain_logical
from octo_platform.frontend.definitions import SinkDef
from octo_platform.project import CompiledTable, Project

__all__ = ["OctoTranslator", "UNKNOWN_TYPE", "DEFAULT_GROUP"]

UNKNOWN_TYPE = "unknown"  # a column whose type the plan alone does not determine
DEFAULT_GROUP = "default"


class OctoTranslator:
    """Asset key, group, deps, description, metadata, code version and partitions of each
    ``CREATE SOURCE`` (an external asset), ``CREATE STREAMING TABLE`` and ``CREATE SINK``
    (assets; a sink downstream of its table)."""

    def get_asset_key(self, name: str) -> dg.AssetKey:
        """The key of a source or streaming table (default: its name)."""
        return dg.AssetKey(name)

    def get_group_name(self, folder: str) -> str:
        """The group of a sub-folder of ``sql/`` (``""`` -> ``default``, ``a/b`` -> ``a__b``)."""
        if not folder:
            return DEFAULT_GROUP
        return re.sub(r"[^A-Za-z0-9_]", "_", folder.replace("/", "__"))

    def get_source_group_name(self, project: Project, name: str) -> str:
        """The group of a source: the folder of its file (``sql/<folders...>/<name>.sql``)."""
        return self.get_group_name("/".join(Path(project.source(name).file).parts[1:-1]))

    def get_table_group_name(self, table: CompiledTable) -> str:
        return self.get_group_name(table.group)

    def get_sink_group_name(self, project: Project, sink: SinkDef) -> str:
        """A sink's group: its table's."""
        return self.get_table_group_name(project.table(sink.table))

    def get_sink_description(self, project: Project, sink: SinkDef) -> str:
        return _description(project, sink.file, f"CREATE SINK {sink.name} FROM {sink.table}"
                            f"{_with(sink.shown_options)}")

    def get_sink_metadata(self, sink: SinkDef) -> dict[str, Any]:
        """Table, target topic, format, tombstones, other options (secrets hidden)."""
        extra = {k: v for k, v in sink.shown_options.items()
                 if k not in ("connector", "bootstrap_servers", "topic", "format", "tombstones")}
        return {"table": sink.table, "target": sink.target, "format": sink.options["format"],
                "tombstones": sink.tombstones, "sql_file": sink.file,
                **({"options": extra} if extra else {})}

    def get_deps(self, table: CompiledTable) -> list[dg.AssetKey]:
        """The sources and streaming tables the table's SQL reads (views looked through)."""
        return [self.get_asset_key(dep) for dep in table.definition.deps]

    def get_code_version(self, table: CompiledTable) -> str:
        """The plan fingerprint: it changes with the meaning of the query, not its format."""
        return table.physical.fingerprint

    def get_source_description(self, project: Project, name: str) -> str:
        s = project.source(name)
        cols = ",\n".join(f"    {c} {t}" for c, t in zip(s.columns, s.types))
        return _description(project, s.file,
                            f"CREATE SOURCE {s.name} (\n{cols}\n){_with(s.shown_options)}")

    def get_table_description(self, project: Project, table: CompiledTable) -> str:
        d = table.definition
        return _description(
            project, d.file, f"CREATE STREAMING TABLE {table.name}{_with(d.options)} AS\n{d.sql}")

    def get_source_metadata(self, project: Project, name: str) -> dict[str, Any]:
        """Column schema, connector, resolved path, format, mode, primary key, options."""
        s = project.source(name)
        meta: dict[str, Any] = {
            "dagster/column_schema": dg.TableSchema(columns=[
                dg.TableColumn(c, t.upper(), description="primary key" if s.pk and c in s.pk
                               else None) for c, t in zip(s.columns, s.types)]),
            "connector": s.connector,
            "path": dg.MetadataValue.path(project.source_path(s)),
            "mode": s.mode,
            "primary_key": ", ".join(s.pk) if s.pk else "none",
            "sql_file": s.file,
        }
        if s.format:
            meta["format"] = s.format
        extra = {k: v for k, v in s.shown_options.items()
                 if k not in ("connector", "path", "format", "primary_key", "mode")}
        if extra:
            meta["options"] = extra
        return meta

    def get_table_metadata(self, table: CompiledTable,
                           types: Mapping[str, str | None]) -> dict[str, Any]:
        """Column schema (``types`` where the plan determines them), column lineage, SQL
        file, primary key, changelog mode, state tables, logical plan, partitions."""
        d = table.definition
        pk = d.pk or ()
        lineage = column_lineage(d.plan)
        meta: dict[str, Any] = {
            "dagster/column_schema": dg.TableSchema(columns=[
                dg.TableColumn(c, types.get(c) or UNKNOWN_TYPE,
                               description="primary key" if c in pk else None)
                for c in d.columns]),
            "dagster/column_lineage": dg.TableColumnLineage({
                c: [dg.TableColumnDep(self.get_asset_key(scan), col)
                    for scan, col in sorted(lineage[c])]
                for c in d.columns}),
            "sql_file": d.file,
            "primary_key": ", ".join(pk) if pk else "none (a bag of rows: no u events)",
            "changelog_mode": d.plan.mode,
            "state_tables": ", ".join(table.physical.state_tables) or "none (stateless)",
            "plan": dg.MetadataValue.md(f"```\n{explain_logical(d.plan)}\n```"),
        }
        if d.partitioning is not None:
            meta["partition_by"] = f"{d.partitioning.column} ({d.partitioning.granularity})"
        return meta

    def get_partitions_def(self, table: CompiledTable
                           ) -> dg.TimeWindowPartitionsDefinition | None:
        """Hourly / daily / monthly partitions for a table declaring ``partition_by`` (UTC,
        the current, still open period included); None for the others."""
        p = table.definition.partitioning
        if p is None:
            return None
        cls = {"hourly": dg.HourlyPartitionsDefinition, "daily": dg.DailyPartitionsDefinition,
               "monthly": dg.MonthlyPartitionsDefinition}[p.granularity]
        return cls(start_date=p.start.strftime(p.key_format), timezone="UTC", end_offset=1)


def _with(options: Mapping[str, str]) -> str:
    if not options:
        return ""
    return " WITH (" + ", ".join(f"{k} = '{v}'" for k, v in options.items()) + ")"


def _description(project: Project, file: str, statement: str) -> str:
    """The SQL file's leading comment, then the statement and where it is defined."""
    comment = _leading_comment(project.root / file)
    parts = [comment] if comment else []
    parts.append(f"```sql\n{statement}\n```")
    parts.append(f"Defined in `{file}`.")
    return "\n\n".join(parts)


def _leading_comment(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return ""
    out: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("--"):
            out.append(stripped[2:].removeprefix(" "))
        elif stripped or out:
            break
    return "\n".join(out).strip()
