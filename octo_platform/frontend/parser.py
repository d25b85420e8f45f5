"""Parse octo SQL files into statements.

A file holds any number of ``CREATE SOURCE``, ``CREATE STREAMING TABLE``, ``CREATE VIEW`` and
``CREATE SINK`` statements separated by semicolons. Queries are Spark SQL, parsed with
sqlglot; every error names the file, line and column of the offending text.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from octo_platform.errors import Location, SqlError
from octo_platform.sqltext import DIALECT

__all__ = [
    "SourceStmt",
    "WatermarkStmt",
    "TableStmt",
    "ViewStmt",
    "SinkStmt",
    "Statement",
    "SqlFile",
    "parse_file",
    "parse_sql",
]


class SqlFile:
    """The text of one SQL file, able to turn offsets into locations."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.text = text

    def location(self, offset: int) -> Location:
        offset = max(0, min(offset, len(self.text)))
        line = self.text.count("\n", 0, offset) + 1
        start = self.text.rfind("\n", 0, offset) + 1
        end = self.text.find("\n", offset)
        line_text = self.text[start : end if end >= 0 else len(self.text)]
        return Location(self.path, line, offset - start + 1, line_text)

    def location_of(self, node: exp.Expression, fallback: int = 0) -> Location:
        """Where ``node`` (or the first of its descendants sqlglot recorded a position for) is."""
        for sub in node.walk():
            if sub.meta.get("start") is not None:
                return self.location(int(sub.meta["start"]))
        return self.location(fallback)

    def select_location(self, select: exp.Select) -> Location:
        """Where ``select`` is written: the SELECT keyword before the first position
        sqlglot recorded in it."""
        starts = [int(n.meta["start"]) for n in select.walk() if n.meta.get("start") is not None]
        if not starts:
            return self.location(0)
        keywords = [m.start() for m in re.finditer(r"(?i)\bselect\b", self.text[:min(starts)])]
        return self.location(keywords[-1] if keywords else min(starts))

    def call_location(self, call: exp.Func, fallback: int = 0) -> Location:
        """Where ``call`` is written: where sqlglot recorded it, else the name written
        before the ``(`` that precedes the first position it recorded inside (an
        argument's)."""
        starts = [int(n.meta["start"]) for n in call.walk() if n.meta.get("start") is not None]
        if not starts or call.meta.get("start") is not None:
            return self.location(starts[0] if starts else fallback)
        name = re.search(r"(\w+)\s*\(\s*$", self.text[:min(starts)])
        return self.location(name.start(1) if name else min(starts))

    def error(self, message: str, offset: int) -> SqlError:
        return SqlError(message, self.location(offset))


class _Located:
    """A statement whose errors point at it, or at one of its ``WITH`` options."""

    file: SqlFile
    offset: int
    option_offsets: dict[str, int]

    def location(self, option: str | None = None) -> Location:
        """Where ``option`` is written, or the statement (also for an option not given)."""
        return self.file.location(self.option_offsets.get(option or "", self.offset))


@dataclass(frozen=True)
class WatermarkStmt:
    """``WATERMARK FOR column AS expression`` inside a source's column list."""

    column: str
    expression: str  # as written
    offset: int  # where WATERMARK is written
    expression_offset: int


@dataclass(frozen=True)
class SourceStmt(_Located):
    """``CREATE SOURCE name (col type, ..., [WATERMARK FOR col AS expr]) WITH (...)``."""

    name: str
    columns: tuple[tuple[str, str], ...]
    options: dict[str, str]
    file: SqlFile = field(repr=False, compare=False)
    offset: int = 0
    option_offsets: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    watermark: WatermarkStmt | None = None


@dataclass(frozen=True)
class TableStmt(_Located):
    """``CREATE STREAMING TABLE name [WITH (...)] AS query [EMIT ON WINDOW CLOSE]``."""

    name: str
    query: exp.Query
    options: dict[str, str]
    sql: str
    file: SqlFile = field(repr=False, compare=False)
    offset: int = 0
    option_offsets: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    emit_offset: int | None = None  # where ``EMIT ON WINDOW CLOSE`` is written, if it is


@dataclass(frozen=True)
class ViewStmt:
    """``CREATE [OR REPLACE] VIEW name AS query`` (inlined where used)."""

    name: str
    query: exp.Query
    sql: str
    file: SqlFile = field(repr=False, compare=False)
    offset: int = 0


@dataclass(frozen=True)
class SinkStmt(_Located):
    """``CREATE SINK name FROM table WITH (key = 'value', ...)``."""

    name: str
    table: str
    options: dict[str, str]
    file: SqlFile = field(repr=False, compare=False)
    offset: int = 0
    option_offsets: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    table_offset: int = 0  # where the table's name is written


Statement = SourceStmt | TableStmt | ViewStmt | SinkStmt


def parse_file(path: str | Path) -> list[Statement]:
    """Parse every statement of one ``.sql`` file."""
    p = Path(path)
    return parse_sql(p.read_text(encoding="utf-8"), path=str(p))


def parse_sql(text: str, *, path: str = "<sql>") -> list[Statement]:
    """Parse SQL text holding one or more octo statements."""
    sql_file = SqlFile(path, text)
    try:
        tokens = Dialect.get_or_raise(DIALECT).tokenize(text)
    except TokenError as e:
        raise SqlError(f"cannot tokenize SQL: {e}", sql_file.location(0)) from e
    statements: list[Statement] = []
    chunk: list[Token] = []
    for token in [*tokens, None]:
        if token is None or token.token_type == TokenType.SEMICOLON:
            if chunk:
                statements.append(_parse_statement(sql_file, chunk))
            chunk = []
        else:
            chunk.append(token)
    return statements


class _Cursor:
    def __init__(self, sql_file: SqlFile, tokens: list[Token]) -> None:
        self.file = sql_file
        self.tokens = tokens
        self.i = 0

    def peek(self) -> Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def offset(self) -> int:
        tok = self.peek()
        return tok.start if tok else self.tokens[-1].end + 1

    def word(self) -> str:
        tok = self.peek()
        return tok.text.upper() if tok else ""

    def take(self, *words: str) -> bool:
        """Consume the keywords ``words`` if they come next."""
        n = len(words)
        got = [t.text.upper() for t in self.tokens[self.i : self.i + n]]
        if got == list(words):
            self.i += n
            return True
        return False

    def expect(self, what: str, *words: str) -> None:
        if not self.take(*words):
            raise self.error(f"expected {what}")

    def error(self, message: str) -> SqlError:
        tok = self.peek()
        found = f", found {tok.text!r}" if tok else " before the end of the statement"
        return self.file.error(message + found, self.offset())

    def name(self, what: str) -> str:
        tok = self.peek()
        if tok is None or tok.token_type in (TokenType.L_PAREN, TokenType.R_PAREN, TokenType.COMMA):
            raise self.error(f"expected {what}")
        self.i += 1
        return tok.text

    def balanced(self) -> tuple[int, int]:
        """Consume a parenthesised group and return the text span inside it."""
        if not (tok := self.peek()) or tok.token_type != TokenType.L_PAREN:
            raise self.error("expected '('")
        start, depth = tok.end + 1, 0
        while (tok := self.peek()) is not None:
            self.i += 1
            if tok.token_type == TokenType.L_PAREN:
                depth += 1
            elif tok.token_type == TokenType.R_PAREN:
                depth -= 1
                if depth == 0:
                    return start, tok.start
        raise self.file.error("unbalanced parenthesis", start - 1)

    def options(self) -> tuple[dict[str, str], dict[str, int]]:
        """``WITH (key = value, ...)``; keys are lower-cased, values kept as written. Also
        the offset of each key, so an error about an option can point at it."""
        opts: dict[str, str] = {}
        offsets: dict[str, int] = {}
        if not self.take("WITH"):
            return opts, offsets
        if not (tok := self.peek()) or tok.token_type != TokenType.L_PAREN:
            raise self.error("expected '(' after WITH")
        self.i += 1
        while True:
            key_tok = self.peek()
            if key_tok is None:
                raise self.error("expected ')' to close WITH (...)")
            if key_tok.token_type == TokenType.R_PAREN:
                self.i += 1
                return opts, offsets
            key = self.name("an option name").lower()
            while self.take("."):  # a dotted name: kafka.security.protocol
                key += "." + self.name("an option name after '.'").lower()
            if not self.take("="):
                raise self.error(f"expected '=' after option {key!r}")
            val = self.peek()
            if val is None or val.token_type in (TokenType.COMMA, TokenType.R_PAREN):
                raise self.error(f"expected a value for option {key!r}")
            self.i += 1
            if key in opts:
                raise self.file.error(f"option {key!r} given twice", key_tok.start)
            opts[key] = val.text
            offsets[key] = key_tok.start
            if (nxt := self.peek()) is not None and nxt.token_type == TokenType.COMMA:
                self.i += 1


def _parse_statement(sql_file: SqlFile, tokens: list[Token]) -> Statement:
    cur = _Cursor(sql_file, tokens)
    start = tokens[0].start
    if not cur.take("CREATE"):
        raise cur.error("expected CREATE SOURCE, CREATE STREAMING TABLE, CREATE VIEW or "
                        "CREATE SINK")
    if cur.take("SOURCE"):
        name = cur.name("a source name")
        first = cur.i + 1
        begin, end = cur.balanced()
        body, watermark = _split_watermark(sql_file, begin, end, cur.tokens[first:cur.i - 1])
        columns = _parse_columns(sql_file, begin, body)
        options, offsets = cur.options()
        if cur.peek() is not None:
            raise cur.error("unexpected text after CREATE SOURCE")
        return SourceStmt(name, columns, options, sql_file, start, offsets, watermark)
    if cur.take("STREAMING", "TABLE"):
        name = cur.name("a table name")
        options, offsets = cur.options()
        cur.expect("AS", "AS")
        emit = _emit_clause(cur)
        query, sql = _parse_query(sql_file, cur)
        return TableStmt(name, query, options, sql, sql_file, start, offsets, emit)
    if cur.take("SINK"):
        name = cur.name("a sink name")
        cur.expect("FROM followed by the streaming table it publishes", "FROM")
        table_offset = cur.offset()
        table = cur.name("the streaming table the sink publishes")
        options, offsets = cur.options()
        if cur.peek() is not None:
            raise cur.error("unexpected text after CREATE SINK")
        return SinkStmt(name, table, options, sql_file, start, offsets, table_offset)
    cur.take("OR", "REPLACE")
    cur.take("TEMPORARY") or cur.take("TEMP")
    if cur.take("VIEW"):
        name = cur.name("a view name")
        cur.expect("AS", "AS")
        query, sql = _parse_query(sql_file, cur)
        return ViewStmt(name, query, sql, sql_file, start)
    raise cur.error("expected SOURCE, STREAMING TABLE, VIEW or SINK after CREATE")


EMIT_CLAUSE = ("EMIT", "ON", "WINDOW", "CLOSE")


def _emit_clause(cur: _Cursor) -> int | None:
    """Take a trailing ``EMIT ON WINDOW CLOSE`` off the statement's tokens; its offset."""
    emits = [i for i in range(cur.i, len(cur.tokens)) if cur.tokens[i].text.upper() == "EMIT"
             and cur.tokens[i].token_type != TokenType.STRING]
    if not emits:
        return None
    at = emits[-1]
    if [t.text.upper() for t in cur.tokens[at:]] != list(EMIT_CLAUSE):
        raise cur.file.error("expected EMIT ON WINDOW CLOSE at the end of the statement "
                             "(the only emit policy besides the default, which emits every "
                             "change)", cur.tokens[at].start)
    offset = cur.tokens[at].start
    del cur.tokens[at:]
    return offset


def _padded(sql_file: SqlFile, begin: int, end: int) -> str:
    """The text between offsets, preceded by blanks so sqlglot reports file positions."""
    prefix = "".join(c if c == "\n" else " " for c in sql_file.text[:begin])
    return prefix + sql_file.text[begin:end]


def _parse_query(sql_file: SqlFile, cur: _Cursor) -> tuple[exp.Query, str]:
    if cur.peek() is None:
        raise cur.error("expected a query after AS")
    begin, end = cur.offset(), cur.tokens[-1].end + 1
    try:
        text = _short_windows(_padded(sql_file, begin, end), cur.tokens[cur.i:])
        tree = sqlglot.parse_one(text, dialect=DIALECT)
    except ParseError as e:
        err = e.errors[0] if e.errors else {}
        line, col = int(err.get("line", 1)), int(err.get("col", 1))
        highlight = str(err.get("highlight") or "")
        offset = _offset_of(sql_file.text, line, col - max(len(highlight) - 1, 0))
        desc = str(err.get("description") or e).split(". Line")[0]
        desc = desc.split(" <Token")[0] if "<Token" in desc else desc
        raise SqlError(f"syntax error: {desc}", sql_file.location(offset)) from e
    if not isinstance(tree, exp.Query):
        raise sql_file.error("expected a SELECT query after AS", begin)
    return tree, sql_file.text[begin:end].strip()


WINDOW_TVFS = ("TUMBLE", "HOP", "SESSION")
SESSION_CALL = "SESSWIN"  # what a SESSION(...) call in FROM is parsed as (same length)


def _short_windows(text: str, tokens: list[Token]) -> str:
    """Flink's long form of a window function, ``TABLE(TUMBLE(TABLE t, DESCRIPTOR(ts),
    ...))``, as the short one, ``TUMBLE(t, ts, ...)``: the extra words and parentheses
    blanked, so every offset stays the file's; ``SESSION(`` as ``SESSWIN(``."""

    def closing(i: int) -> int:  # index of the parenthesis closing the one at i
        depth = 0
        for j in range(i, len(tokens)):
            depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tokens[j].token_type, 0)
            if depth == 0:
                return j
        return len(tokens) - 1

    def word(i: int) -> str:
        return tokens[i].text.upper() if i < len(tokens) else ""

    def paren(i: int) -> bool:
        return i < len(tokens) and tokens[i].token_type == TokenType.L_PAREN

    blank: list[Token] = []
    for i in range(len(tokens)):
        if word(i) == "TABLE" and paren(i + 1) and word(i + 2) in WINDOW_TVFS and paren(i + 3):
            end = closing(i + 3)
            blank += [tokens[i], tokens[i + 1], tokens[closing(i + 1)]]
            if word(i + 4) == "TABLE":
                blank.append(tokens[i + 4])
            for j in range(i + 4, end):
                if word(j) == "DESCRIPTOR" and paren(j + 1):
                    blank += [tokens[j], tokens[j + 1], tokens[closing(j + 1)]]
    chars = list(text)
    for tok in blank:
        chars[tok.start:tok.end + 1] = " " * (tok.end + 1 - tok.start)
    for i in range(len(tokens)):  # sqlglot cannot parse SESSION(...): the same-length name
        if word(i) == "SESSION" and paren(i + 1) and (i == 0 or word(i - 1) in (
                "FROM", "JOIN", ",", "(")):
            chars[tokens[i].start:tokens[i].end + 1] = SESSION_CALL
    return "".join(chars)


def _offset_of(text: str, line: int, col: int) -> int:
    pos = 0
    for _ in range(line - 1):
        nxt = text.find("\n", pos)
        if nxt < 0:
            break
        pos = nxt + 1
    return pos + max(col - 1, 0)


def _split_watermark(sql_file: SqlFile, begin: int, end: int, tokens: list[Token]
                     ) -> tuple[str, WatermarkStmt | None]:
    """The column list ``text[begin:end]`` without its ``WATERMARK FOR col AS expr`` item
    (blanked, so offsets stay those of the file), and that item."""
    items: list[list[Token]] = [[]]
    commas: list[Token] = []
    depth = 0
    for tok in tokens:
        if tok.token_type == TokenType.COMMA and depth == 0:
            commas.append(tok)
            items.append([])
            continue
        depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tok.token_type, 0)
        items[-1].append(tok)
    marks = [i for i, item in enumerate(items)
             if [t.text.upper() for t in item[:2]] == ["WATERMARK", "FOR"]]
    body = sql_file.text[begin:end]
    if not marks:
        return body, None
    if len(marks) > 1:
        raise sql_file.error("a source has at most one WATERMARK", items[marks[1]][0].start)
    i = marks[0]
    item = items[i]
    if len(item) < 3:
        raise sql_file.error("expected WATERMARK FOR <column> AS <column> - INTERVAL ...",
                             item[-1].start)
    if len(item) < 5 or item[3].text.upper() != "AS":
        raise sql_file.error(f"expected AS <expression> after WATERMARK FOR {item[2].text}",
                             item[min(3, len(item) - 1)].start)
    expr_start, expr_end = item[4].start, item[-1].end + 1
    watermark = WatermarkStmt(item[2].text, sql_file.text[expr_start:expr_end], item[0].start,
                              expr_start)
    # Blank the item and the comma that separates it from its neighbours.
    cut_from = commas[i - 1].start if i > 0 else item[0].start
    cut_to = item[-1].end + 1 if i > 0 or not commas else commas[0].end + 1
    blank = "".join(c if c == "\n" else " " for c in sql_file.text[cut_from:cut_to])
    body = body[:cut_from - begin] + blank + body[cut_to - begin:]
    return body, watermark


def _parse_columns(sql_file: SqlFile, begin: int, body: str) -> tuple[tuple[str, str], ...]:
    """The ``name TYPE`` items of a source's column list (``body``, starting at ``begin``)."""
    if not body.strip():
        raise sql_file.error("a source needs at least one column", begin)
    try:
        tree = sqlglot.parse_one(f"CREATE TABLE t ({body})", dialect=DIALECT)
    except ParseError as e:
        reason = e.errors[0]["description"] if e.errors else str(e)
        raise sql_file.error(f"cannot parse the column list: {reason}", begin) from e
    schema = tree.this
    columns: list[tuple[str, str]] = []
    for col in schema.expressions:
        if not isinstance(col, exp.ColumnDef) or col.args.get("kind") is None:
            raise sql_file.error(f"expected 'name TYPE', found {col.sql(DIALECT)!r}", begin)
        columns.append((col.name, col.args["kind"].sql(DIALECT)))
    names = [c.lower() for c, _ in columns]
    for c in names:
        if names.count(c) > 1:
            raise sql_file.error(f"column {c!r} declared twice", begin)
    return tuple(columns)
