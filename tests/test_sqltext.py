"""The shared Spark SQL text helpers: quoting, column references, conjunctions."""
from __future__ import annotations

import pytest

from octo_platform.sqltext import and_, quote, referenced_columns, rename_columns, unquote


def test_quote_and_unquote():
    assert quote("a`b") == "`a``b`"
    assert unquote("`a``b`") == "a`b"
    assert unquote("`a` + 1") is None and unquote("'`a`'") is None


def test_references_outside_strings_only():
    sql = "concat(`x`, 'it\\'s `not` a column', \"`nor` this\") = `it's`"
    assert referenced_columns(sql) == {"x", "it's"}
    assert rename_columns(sql, {"x": "a.x", "it's": "b"}) == (
        "concat(`a.x`, 'it\\'s `not` a column', \"`nor` this\") = `b`")


@pytest.mark.parametrize("parts,expected", [
    (["`a` OR `b`"], "`a` OR `b`"),
    (["`a` OR `b`", "`c` = 1"], "(`a` OR `b`) AND `c` = 1"),
    (["`a` BETWEEN 1 AND 2", "`s` = 'x OR y'"], "`a` BETWEEN 1 AND 2 AND `s` = 'x OR y'"),
    (["CASE WHEN `a` OR `b` THEN 1 END = 1", "(`a` OR `b`) = `c`"],
     "CASE WHEN `a` OR `b` THEN 1 END = 1 AND (`a` OR `b`) = `c`"),
])
def test_and_parenthesizes_disjunctions(parts, expected):
    assert and_(parts) == expected
