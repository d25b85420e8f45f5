"""Each rewrite rule of the logical optimizer on its own, against golden plans.

``tests/fixtures/rules/<rule>.sql`` holds cases in sqlglot's ``tests/fixtures/optimizer``
shape: a ``# title:`` line, a query over the sources of ``sources.sql``, and the plan the
rule alone makes of the bound query (``explain`` text), each ending with ``;``. Every rule
in ``RULES`` needs a file, and every case a plan: a missing one fails, nothing is written.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from octo_platform.frontend.binder import build_catalog
from octo_platform.frontend.parser import parse_sql
from octo_platform.logical.optimizer import RULES, Rule
from octo_platform.logical.plan import explain

FIXTURES = Path(__file__).parent / "fixtures" / "rules"
SOURCES = (FIXTURES / "sources.sql").read_text()


def load_cases(path: Path) -> list[tuple[str, str, str | None]]:
    """The ``(title, query, expected plan)`` cases of a rule fixture."""
    _, *blocks = path.read_text().split("# title:")
    cases = []
    for block in blocks:
        title, _, body = block.partition("\n")
        lines = body.strip().splitlines()
        end = next(i for i, line in enumerate(lines) if line.rstrip().endswith(";"))
        query = "\n".join(lines[: end + 1]).rstrip().removesuffix(";")
        rest = "\n".join(lines[end + 1 :]).rstrip()
        cases.append((title.strip(), query, rest.removesuffix(";") if rest.endswith(";")
                      else None))
    return cases


def rule_cases():
    for rule in RULES:
        path = FIXTURES / f"{rule.__name__}.sql"
        if not path.exists():
            yield pytest.param(rule, path, "", None, id=f"{rule.__name__}-no-fixture-file")
            continue
        for title, query, expected in load_cases(path):
            yield pytest.param(rule, path, query, expected, id=f"{rule.__name__}: {title}")


@pytest.mark.parametrize("rule,path,query,expected", list(rule_cases()))
def test_rule(rule: Rule, path: Path, query: str, expected: str | None):
    if not path.exists():
        pytest.fail(f"rule {rule.__name__} has no fixture file {path}")
    sql = f"{SOURCES}\nCREATE STREAMING TABLE t AS {query};"
    plan = build_catalog(parse_sql(sql, path=str(path)), rules=(rule,)).table("t").plan
    if expected is None:
        pytest.fail(f"no expected plan for this case in {path}; the rule makes:\n"
                    f"{explain(plan)}")
    assert explain(plan) == expected
