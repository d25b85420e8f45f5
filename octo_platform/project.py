"""A project: the ``sql/`` folder of a repo compiled into streaming tables.

``load_project`` runs every stage up to the physical plan (parse, bind, plan, lower), so a
broken file fails before anything touches data.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from octo_platform.errors import CatalogError, OctoError, SqlError
from octo_platform.frontend.binder import Catalog, build_catalog
from octo_platform.frontend.definitions import SinkDef, SourceDef, TableDef
from octo_platform.frontend.parser import Statement, parse_sql
from octo_platform.logical.plan import explain as explain_logical
from octo_platform.physical.plan import PhysicalPlan, lower
from octo_platform.physical.plan import explain as explain_physical

__all__ = ["CompiledTable", "Project", "load_project", "DEFAULT_WAREHOUSE"]

DEFAULT_WAREHOUSE = "warehouse"  # relative to the project directory


@dataclass(frozen=True)
class CompiledTable:
    definition: TableDef
    physical: PhysicalPlan
    group: str

    @property
    def name(self) -> str:
        return self.definition.name


class Project:
    """Compiled streaming tables and sources of one project directory."""

    def __init__(self, root: Path, catalog: Catalog, groups: dict[str, str]) -> None:
        self.root = root
        self.catalog = catalog
        self.tables: dict[str, CompiledTable] = {}
        for t in catalog.tables():
            plan = lower(t.name, t.plan, t.pk)
            self.tables[t.name.lower()] = CompiledTable(t, plan, groups.get(t.name.lower(), ""))
        self.sinks: dict[str, SinkDef] = {s.name.lower(): s for s in catalog.sinks()}

    def table(self, name: str) -> CompiledTable:
        return _find(self.tables, name, "streaming table")

    def sink(self, name: str) -> SinkDef:
        return _find(self.sinks, name, "sink")

    def sinks_of(self, table: str) -> list[SinkDef]:
        """The sinks publishing ``table``'s changelog, by name."""
        return sorted((s for s in self.sinks.values() if s.table.lower() == table.lower()),
                      key=lambda s: s.name.lower())

    def check_functions(self, exists: Callable[[str], bool]) -> None:
        """Fail (``SqlError``, at the call) on a call of a function Spark does not have,
        before anything runs: ``exists`` is the session's ``catalog.functionExists`` (a
        session's own functions count). The binder knows most of Spark's functions; only
        the others are asked about, once each."""
        asked: dict[str, bool] = {}
        for name, where in self.catalog.function_calls():
            if "." in name:  # a qualified name: Spark resolves it
                continue
            key = name.lower()
            if key not in asked:
                asked[key] = exists(name)
            if not asked[key]:
                raise SqlError(f"unknown function {name}(): Spark has no function of that "
                               "name (nor has the session one)", where)

    def source(self, name: str) -> SourceDef:
        return self.catalog.sources[name.lower()]

    def source_path(self, source: SourceDef) -> str:
        """Where a source reads: its path resolved against the project (a Kafka source:
        ``kafka://<bootstrap servers>/<topic>``)."""
        if source.connector == "kafka":
            return f"kafka://{source.options['bootstrap_servers']}/{source.options['topic']}"
        if "://" in source.options["path"]:  # a URI (s3://..., file://...) stays as written
            return source.options["path"]
        path = Path(source.options["path"])
        return str(path if path.is_absolute() else (self.root / path).resolve())

    def uris(self, warehouse: str) -> list[str]:
        """Where the project's tables (``warehouse``) and sources live: what its Spark
        session must be able to read (an object store's connector)."""
        return [warehouse, *(self.source_path(s) for s in self.catalog.sources.values())]

    def order(self, names: list[str] | None = None) -> list[CompiledTable]:
        """Tables in dependency order (upstream first); ``names`` selects a subset."""
        wanted = {self.table(n).name.lower() for n in names} if names else set(self.tables)
        done: list[str] = []

        def visit(key: str) -> None:
            if key in done:
                return
            for dep in self.tables[key].definition.deps:
                if dep.lower() in self.tables:
                    visit(dep.lower())
            done.append(key)

        for key in sorted(self.tables):
            visit(key)
        return [self.tables[k] for k in done if k in wanted]

    def explain(self, name: str) -> str:
        t = self.table(name)
        text = (f"== Logical plan: {t.name} ==\n{explain_logical(t.definition.plan)}\n\n"
                f"== Physical plan: {t.name} ==\n{explain_physical(t.physical)}")
        sinks = [f"{s.name}: {s.target} ({s.options['format']}"
                 f"{', tombstones' if s.tombstones else ''}), published after each batch"
                 for s in self.sinks_of(t.name)]
        marks = [f"source {sdef.name}: WATERMARK FOR {sdef.watermark.column} AS "
                 f"{sdef.watermark.sql} (rows below the source's watermark are late: dead "
                 "letters)"
                 for src in t.physical.sources if src.kind == "source"
                 and (sdef := self.source(src.name)).watermark is not None]
        marks += [f"table {up.name}: its watermark, through {up.definition.event_time}"
                  for src in t.physical.sources if src.kind == "table"
                  and (up := self.table(src.name)).definition.event_time is not None]
        if t.definition.event_time is not None:
            marks.append(f"passes its watermark on through {t.definition.event_time}")
        if marks:
            text += (f"\n\n== Event time of {t.name} ==\n" + "\n".join(marks) +
                     "\ntable watermark: the least of its inputs' watermarks")
        return text + (f"\n\n== Sinks of {t.name} ==\n" + "\n".join(sinks) if sinks else "")


T = TypeVar("T", CompiledTable, SinkDef)


def _find(items: dict[str, T], name: str, what: str) -> T:
    """``items[name]`` by case-insensitive name, or an error listing the known names."""
    try:
        return items[name.lower()]
    except KeyError:
        known = ", ".join(sorted(i.name for i in items.values())) or "none"
        raise CatalogError(f"unknown {what} {name!r} (known: {known})") from None


def load_project(root: str | Path, *, sql_dir: str = "sql") -> Project:
    """Parse and compile every ``.sql`` file under ``<root>/<sql_dir>`` (recursively)."""
    root = Path(root).resolve()
    folder = root / sql_dir
    if not folder.is_dir():
        raise OctoError(f"no SQL folder at {folder} (use --project to point at a project)")
    statements: list[Statement] = []
    groups: dict[str, str] = {}
    for path in sorted(folder.rglob("*.sql")):
        rel = path.relative_to(root)
        stmts = parse_sql(path.read_text(encoding="utf-8"), path=str(rel))
        group = "/".join(path.relative_to(folder).parts[:-1])
        for s in stmts:
            groups[s.name.lower()] = group
        statements.extend(stmts)
    return Project(root, build_catalog(statements), groups)
