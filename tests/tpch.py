"""TPC-H as Debezium feeds for the TPC-H oracle (``test_tpch.py``): the data of DuckDB's
generator (PyPI ``duckdb-extension-tpch``, loaded from the package's own file: no network)
at a small scale factor, its 22 query texts as streaming tables, and refresh batches.

A batch after the initial load holds TPC-H's refresh functions, new orders with their line
items (RF1: copies of existing orders under new keys) and deleted orders with theirs (RF2),
plus updates of dimension rows (a customer's segment, a supplier's nation, a part's type, a
part supplier's cost) and of line items (their quantity), each a Debezium ``u`` event.
"""
from __future__ import annotations

import glob
import random
from typing import Any

import sqlglot

from tests.oracle import _json

KEYS = {"nation": ("n_nationkey",), "region": ("r_regionkey",), "part": ("p_partkey",),
        "supplier": ("s_suppkey",), "partsupp": ("ps_partkey", "ps_suppkey"),
        "customer": ("c_custkey",), "orders": ("o_orderkey",),
        "lineitem": ("l_orderkey", "l_linenumber")}
_TYPES = {"INTEGER": "INT", "BIGINT": "BIGINT", "VARCHAR": "STRING", "DATE": "DATE"}


def _connect(sf: float) -> Any:
    import duckdb
    import duckdb_extension_tpch

    (path,) = glob.glob(f"{duckdb_extension_tpch.__path__[0]}/extensions/*/tpch.duckdb_extension")
    con = duckdb.connect()
    con.execute(f"LOAD '{path}'")
    con.execute(f"CALL dbgen(sf={sf})")
    return con


def query_text(text: str) -> str:
    """One of the 22 texts as a streaming table's SELECT: in Spark's syntax, its top-level
    ORDER BY dropped unless a LIMIT keeps it (then it is a top-N)."""
    q = sqlglot.parse_one(text, read="duckdb")
    if q.args.get("limit") is None:
        q.set("order", None)
    return q.sql("spark")


class Tpch:
    """The eight tables' rows by key, their columns' types (``money``: the type of the
    DECIMAL(15,2) columns, e.g. ``DOUBLE``) and the 22 queries."""

    def __init__(self, sf: float = 0.01, seed: int = 1, money: str = "DECIMAL(15,2)") -> None:
        con = _connect(sf)
        self.rng = random.Random(seed)
        self.types: dict[str, list[tuple[str, str]]] = {}
        self.rows: dict[str, dict[tuple, dict[str, Any]]] = {}
        for table, key in KEYS.items():
            cols = [(c, _TYPES.get(t, money if t.startswith("DECIMAL") else t))
                    for c, t, *_ in con.execute(f"DESCRIBE {table}").fetchall()]
            self.types[table] = cols
            cur = con.execute(f"SELECT * FROM {table}")
            names = [c for c, _ in cols]
            self.rows[table] = {}
            for values in cur.fetchall():
                row = dict(zip(names, values))
                if money == "DOUBLE":
                    row = {c: float(v) if t == "DOUBLE" else v
                           for (c, t), v in zip(cols, row.values())}
                self.rows[table][tuple(row[k] for k in key)] = row
        self.queries = {f"q{n}": query_text(q) for n, q in con.execute(
            "SELECT query_nr, query FROM tpch_queries()").fetchall()}
        con.close()

    def sources_sql(self) -> str:
        return "\n".join(
            f"CREATE SOURCE {t} ({', '.join(f'{c} {ty}' for c, ty in self.types[t])}) WITH "
            f"(connector = 'files', path = 'data/{t}', format = 'debezium-json', "
            f"primary_key = '{','.join(KEYS[t])}');" for t in KEYS)

    def relation(self, table: str) -> list[dict[str, Any]]:
        return list(self.rows[table].values())

    def load(self) -> dict[str, list[str]]:
        """The initial load: a ``c`` event per row."""
        return {t: [_event("c", None, r) for r in rows.values()] for t, rows in
                self.rows.items()}

    def refresh(self, fraction: float = 0.005) -> dict[str, list[str]]:
        """One refresh batch: RF1 and RF2 over ``fraction`` of the orders each, and updates."""
        out: dict[str, list[str]] = {t: [] for t in KEYS}
        orders, items = self.rows["orders"], self.rows["lineitem"]
        by_order: dict[Any, list[tuple]] = {}
        for k in items:
            by_order.setdefault(k[0], []).append(k)
        n = max(1, int(len(orders) * fraction))
        top = max(k[0] for k in orders)
        for i, old in enumerate(self.rng.sample(sorted(orders), n)):  # RF1
            new = {**orders[old], "o_orderkey": top + 1 + i}
            self._put(out, "orders", new)
            for k in by_order.get(old[0], []):
                self._put(out, "lineitem", {**items[k], "l_orderkey": top + 1 + i})
        for old in self.rng.sample(sorted(k for k in orders if k[0] <= top), n):  # RF2
            for k in by_order.get(old[0], []):
                out["lineitem"].append(_event("d", items.pop(k), None))
            out["orders"].append(_event("d", orders.pop(old), None))
        segments = sorted({r["c_mktsegment"] for r in self.rows["customer"].values()})
        types = sorted({r["p_type"] for r in self.rows["part"].values()})
        nations = sorted(k[0] for k in self.rows["nation"])
        self._update(out, "customer", 5, lambda r: {"c_mktsegment": self.rng.choice(segments)})
        self._update(out, "supplier", 3, lambda r: {"s_nationkey": self.rng.choice(nations)})
        self._update(out, "part", 5, lambda r: {"p_type": self.rng.choice(types)})
        self._update(out, "partsupp", 10, lambda r: {"ps_supplycost": r["ps_supplycost"] + 1})
        self._update(out, "lineitem", 20, lambda r: {"l_quantity": r["l_quantity"] + 1})
        return out

    def _put(self, out: dict[str, list[str]], table: str, row: dict[str, Any]) -> None:
        self.rows[table][tuple(row[k] for k in KEYS[table])] = row
        out[table].append(_event("c", None, row))

    def _update(self, out: dict[str, list[str]], table: str, n: int, change: Any) -> None:
        rows = self.rows[table]
        for k in self.rng.sample(sorted(rows), min(n, len(rows))):
            new = {**rows[k], **change(rows[k])}
            out[table].append(_event("u", rows[k], new))
            rows[k] = new


def _event(op: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    return _json({"before": _plain(before), "after": _plain(after), "op": op})


def _plain(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """A row's values as JSON takes them (dates as ISO text)."""
    if row is None:
        return None
    return {c: v.isoformat() if hasattr(v, "isoformat") else v for c, v in row.items()}
