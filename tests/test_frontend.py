"""Frontend and planner: parsing, binding errors with locations, golden plans."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from octo_platform.errors import OctoError, SqlError
from octo_platform.frontend.parser import SourceStmt, TableStmt, ViewStmt, parse_sql
from octo_platform.project import load_project

FIXTURES = Path(__file__).parent / "fixtures"
FAIL = sorted((FIXTURES / "fail").glob("*.sql"))
PLANS = sorted((FIXTURES / "plans").glob("*.sql"))


def compile_text(tmp_path: Path, text: str, name: str = "t.sql"):
    (tmp_path / "sql").mkdir(exist_ok=True)
    (tmp_path / "sql" / name).write_text(text)
    return load_project(tmp_path)


def test_statements_options_and_columns():
    stmts = parse_sql("""
        -- a comment; with a semicolon
        CREATE SOURCE s (a BIGINT, `b c` STRING, d DECIMAL(10, 2), e ARRAY<INT>)
        WITH (connector = 'files', path = 'x;y', format = 'json', max_files_per_batch = 3);
        CREATE VIEW v AS SELECT a FROM s;
        CREATE STREAMING TABLE t WITH (primary_key = 'a') AS SELECT a, COUNT(*) AS n
          FROM v GROUP BY a
    """)
    assert [type(s) for s in stmts] == [SourceStmt, ViewStmt, TableStmt]
    src = stmts[0]
    assert src.columns == (("a", "BIGINT"), ("b c", "STRING"), ("d", "DECIMAL(10, 2)"),
                           ("e", "ARRAY<INT>"))
    assert src.options == {"connector": "files", "path": "x;y", "format": "json",
                           "max_files_per_batch": "3"}
    assert stmts[2].options == {"primary_key": "a"}


@pytest.mark.parametrize("path", FAIL, ids=[p.stem for p in FAIL])
def test_rejected_with_location(tmp_path, path):
    """``-- fail=<message part>`` then ``-- at=<line>:<column>``: where the caret points."""
    text = path.read_text()
    fail, at = text.splitlines()[:2]
    expected = fail.removeprefix("-- fail=")
    with pytest.raises(OctoError) as err:
        compile_text(tmp_path, text, path.name)
    assert expected in str(err.value)
    if isinstance(err.value, SqlError):
        assert at.startswith("-- at="), f"{path.name}: pin the caret with '-- at=L:C'"
        loc = err.value.location
        assert loc is not None and loc.file == f"sql/{path.name}"
        assert f"{loc.line}:{loc.col}" == at.removeprefix("-- at=")
        assert f"sql/{path.name}:{loc.line}:{loc.col}" in str(err.value)


def test_error_points_at_the_offending_text(tmp_path):
    text = ("CREATE SOURCE s (a BIGINT) WITH (connector='files', path='p', format='json');\n"
            "CREATE STREAMING TABLE t AS\n"
            "SELECT a,\n"
            "       nope + 1 AS b\n"
            "FROM s;\n")
    with pytest.raises(SqlError) as err:
        compile_text(tmp_path, text)
    loc = err.value.location
    assert (loc.line, loc.col) == (4, 8)
    assert "nope + 1" in str(err.value) and "^" in str(err.value)


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_golden_plans(tmp_path, path):
    project = compile_text(tmp_path, path.read_text())
    text = "\n\n".join(project.explain(t.name) for t in project.order())
    golden = path.with_suffix(".plan")
    if not golden.exists():
        pytest.fail(f"no golden plan {golden}; the planner makes:\n{text}")
    assert text + "\n" == golden.read_text()
    again = load_project(tmp_path)
    assert all(again.tables[k].physical.fingerprint == t.physical.fingerprint
               for k, t in project.tables.items())


def test_modes_and_keys(tmp_path):
    project = compile_text(tmp_path, (FIXTURES / "plans" / "nested.sql").read_text())
    stats, hist = project.table("stats"), project.table("histogram")
    rbc, channels = project.table("reserve_by_category"), project.table("channels")
    assert stats.physical.pk == ("auction",) and hist.physical.pk == ("bids",)
    assert rbc.definition.plan.mode == "updating"
    strategies = {a.func: a.strategy for n in rbc.physical.operators
                  for a in getattr(n, "aggs", ())}
    assert strategies == {"min": "multiset", "max": "multiset"}
    stat_strategies = [a.strategy for n in stats.physical.operators for a in getattr(n, "aggs", ())]
    assert "running" in stat_strategies  # MAX over append-only input needs no multiset
    assert channels.physical.pk is None and channels.definition.plan.mode == "updating"
    assert [t.name for t in project.order(["histogram"])] == ["histogram"]
    assert [t.name for t in project.order()].index("stats") < \
        [t.name for t in project.order()].index("histogram")


def test_a_function_spark_does_not_have_fails_at_its_call_before_anything_runs(spark,
                                                                               tmp_path):
    """sqlglot knows neither ``crc32`` nor ``foo``: both bind; a run asks Spark about them
    and fails at the call of the one it lacks, naming file, line and column, before it
    writes anything (Spark's own error came at the first batch, without them)."""
    from octo_platform.runtime.runner import run_tables
    from octo_platform.wiring import default_options

    text = ("CREATE SOURCE s (a BIGINT, ts TIMESTAMP) WITH (connector='files', path='p', "
            "format='json');\n"
            "CREATE VIEW v AS SELECT a, crc32(CAST(a AS STRING)) AS c FROM s;\n"
            "CREATE STREAMING TABLE t AS\n"
            "SELECT a, c, octo_test_nope(a) AS b FROM v;\n"
            "CREATE STREAMING TABLE w AS SELECT window_end, COUNT(*) AS n\n"
            "FROM TUMBLE(s, ts, INTERVAL '1' MINUTE) GROUP BY window_start, window_end;\n")
    project = compile_text(tmp_path, text)
    with pytest.raises(SqlError) as err:
        run_tables(spark, tmp_path, options=default_options(progress=None))
    loc = err.value.location
    assert (loc.file, loc.line, loc.col) == ("sql/t.sql", 4, 14)
    assert "unknown function octo_test_nope()" in str(err.value)
    assert not (tmp_path / "warehouse").exists()
    # a function of the session's own; TUMBLE in FROM is octo's, never asked about
    spark.udf.register("octo_test_nope", lambda a: a)
    try:
        project.check_functions(spark.catalog.functionExists)
    finally:
        spark.sql("DROP TEMPORARY FUNCTION octo_test_nope")


def test_an_expression_spark_cannot_analyse_fails_at_its_call(spark, tmp_path):
    """A batch that fails on an expression Spark cannot analyse fails the run with the
    error located in the SQL: Spark analyses the table's plan over empty inputs of its
    sources' declared columns (no job; ``octo check`` does it for every table), and the
    error points at the call Spark names (here in a view the table reads; above a GROUP BY,
    a join, an upstream table, top-N, SESSION windows, OVER) or at the statement, with
    nothing committed; a continuous run analyses every table before it starts; joins,
    windows, unions and tables over tables that are right pass."""
    from octo_platform.runtime.checks import check_expressions
    from octo_platform.runtime.runner import run_tables
    from octo_platform.wiring import default_options

    text = ("CREATE SOURCE s (a BIGINT, name STRING, ts TIMESTAMP) WITH (connector='files', "
            "path='p', format='json');\n"
            "CREATE SOURCE r (a BIGINT, label STRING) WITH (connector='files', path='q', "
            "format='json');\n"
            "CREATE VIEW v AS SELECT a, date_add(ts, name) AS d FROM s;\n"
            "CREATE STREAMING TABLE bad AS\n"
            "SELECT a, MAX(d) AS d FROM v GROUP BY a;\n"
            "CREATE STREAMING TABLE negated AS SELECT a FROM s WHERE NOT a;\n"
            "CREATE STREAMING TABLE iffy AS SELECT a, substr(name, 2) AS n, if(a, 1, 2) AS i\n"
            "FROM s;\n"
            "CREATE STREAMING TABLE over_agg AS SELECT a, size(m) AS x\n"
            "FROM (SELECT a, MAX(name) AS m FROM s GROUP BY a) q;\n"
            "CREATE STREAMING TABLE over_join AS SELECT s.a, size(r.label) AS z\n"
            "FROM s JOIN r ON s.a = r.a;\n"
            "CREATE STREAMING TABLE good AS SELECT s.a, upper(r.label) AS l, COUNT(*) AS n\n"
            "FROM s JOIN r ON s.a = r.a WHERE s.name LIKE 'x%' GROUP BY s.a, upper(r.label);\n"
            "CREATE STREAMING TABLE over_good AS SELECT a, size(l) AS y FROM good;\n"
            "CREATE STREAMING TABLE over_top AS SELECT a, size(rn) AS z FROM (SELECT a,\n"
            "ROW_NUMBER() OVER (PARTITION BY name ORDER BY a) AS rn FROM s) t WHERE rn <= 3;\n"
            "CREATE STREAMING TABLE over_over AS SELECT a, size(s30) AS z FROM (SELECT a,\n"
            "SUM(a) OVER (PARTITION BY name ORDER BY ts RANGE BETWEEN INTERVAL '30' SECOND\n"
            "PRECEDING AND CURRENT ROW) AS s30 FROM s) q;\n"
            "CREATE STREAMING TABLE over_session AS SELECT a, size(window_end) AS e FROM\n"
            "SESSION(s, ts, INTERVAL '20' SECOND) GROUP BY window_start, window_end, a;\n"
            "CREATE STREAMING TABLE w AS SELECT window_end, COUNT(*) AS n\n"
            "FROM TUMBLE(s, ts, INTERVAL '1' MINUTE) GROUP BY window_start, window_end;\n"
            "CREATE STREAMING TABLE u AS SELECT a FROM s UNION ALL SELECT a + 1 FROM r;\n"
            "CREATE STREAMING TABLE above AS SELECT a, n * 2 AS m, lower(l) AS k FROM good\n"
            "WHERE n > 1;\n")
    project = compile_text(tmp_path, text)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "a.json").write_text('{"a": 1, "name": "x", "ts": "2026-12-01"}\n')

    def at(needle: str) -> tuple[int, int]:
        line = next(i for i, t in enumerate(text.splitlines(), 1) if needle in t)
        return line, text.splitlines()[line - 1].index(needle) + 1

    with pytest.raises(SqlError) as err:
        run_tables(spark, tmp_path, names=["bad"], options=default_options(progress=None))
    loc = err.value.location
    assert (loc.file, (loc.line, loc.col)) == ("sql/t.sql", at("date_add("))
    assert "streaming table bad: [DATATYPE_MISMATCH" in str(err.value)
    assert "date_add(ts, name)" in str(err.value) and "line 1 pos" not in str(err.value)
    assert "\n'" not in str(err.value)  # no plan
    assert not (tmp_path / "warehouse" / "bad" / "_delta_log").exists()
    with pytest.raises(SqlError) as err:  # a continuous run analyses every table first
        run_tables(spark, tmp_path, names=["negated"], until_idle=False,
                   deadline=time.time() + 60, options=default_options(progress=None))
    assert "streaming table negated:" in str(err.value)
    assert not (tmp_path / "warehouse" / "_octo" / "negated").exists()  # no batch began
    for table, where in (("negated", at("CREATE STREAMING TABLE negated")),  # no call
                         ("iffy", at("if(a")),  # sqlglot records no position for IF
                         ("over_agg", at("size(m)")), ("over_join", at("size(r.label)")),
                         ("over_good", at("size(l)")), ("over_top", at("size(rn)")),
                         ("over_session", at("size(window_end)")),
                         ("over_over", at("size(s30)"))):
        with pytest.raises(SqlError) as err:
            check_expressions(spark, project, project.order([table]))
        loc = err.value.location
        assert (loc.line, loc.col) == where and f"streaming table {table}:" in str(err.value)
    check_expressions(spark, project, project.order(["good", "w", "u", "above"]))


def test_a_join_key_in_every_branch_of_an_or_is_a_join_key(tmp_path):
    """TPC-H q19's shape: ``p_partkey = l_partkey`` inside each branch of an OR is factored
    out (``shapes.conjuncts``) and the join is an equi-join, not a cross join."""
    from octo_platform.physical.plan import PJoin

    project = compile_text(tmp_path, """
        CREATE SOURCE l (k BIGINT, q BIGINT, m STRING) WITH (connector='files', path='l',
            format='json');
        CREATE SOURCE p (k BIGINT, b STRING, s INT) WITH (connector='files', path='p',
            format='json');
        CREATE STREAMING TABLE t AS SELECT SUM(q) AS n FROM l, p
        WHERE (p.k = l.k AND b = 'x' AND q < 5 AND m = 'AIR')
           OR (l.k = p.k AND b = 'y' AND q > 9 AND m = 'AIR')""")
    (join,) = [n for n in project.table("t").physical.operators if isinstance(n, PJoin)]
    assert [k.replace("`", "") for k in (*join.left_keys, *join.right_keys)] in (
        [["l.k", "p.k"], ["p.k", "l.k"]]), join
    assert "m = 'AIR'" not in (join.residual or "").replace("`", ""), join.residual
