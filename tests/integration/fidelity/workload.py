"""A seeded workload: hostile schemas over the type catalogue, initial rows, then rounds of changes.

Everything is decided from ``random.Random(seed)`` before anything runs, so a seed is a complete,
replayable description (``Workload.script`` prints it as SQL a ``psql`` session can run). The
generator keeps a small model of each table (its columns, and which rows exist by key or by tag)
only to produce statements PostgreSQL accepts; what the rows hold is PostgreSQL's business, and
the test compares the lake with PostgreSQL itself, never with this model.

Rows of tables without a primary key carry a tag column: identical rows share their tag, and an
UPDATE or DELETE picks exactly one of them by ``ctid``, the way PostgreSQL changes one of two
identical rows.
"""

from __future__ import annotations

import copy
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random

from psycopg2 import sql

from tests.integration.fidelity.catalogue import CATALOGUE, PgType, big_text, custom_types, hostile_text

SCHEMAS = ["public", "My Schema", "sch.ema", "Ünï Schema", "per%cent", 'q"uote']
TABLES = [
    "v1.2 sales%",
    "Order Lines",
    "événements",
    'tab "quoted"',
    "it's",
    "MiXeD",
    "a/b",
    "dots.and spaces",
]
COLUMNS = [
    "Order ID", "prix €", "a.b", "%pct", 'say "x"', "it's", "CamelCase", "UPPER", "ünï", "with space",
    "tab/slash", "Value", "value2", "x",
]  # fmt: skip
KEY_TYPES = ["int4", "int8", "text", "uuid"]
# pk: a primary key; full_pk / full_nokey: REPLICA IDENTITY FULL with or without one; nokey_default /
# nokey_nothing: no key, so PostgreSQL refuses UPDATE and DELETE once the table is published.
SHAPES = ["pk", "full_pk", "full_nokey", "nokey_default", "nokey_nothing"]
BY_LABEL = {t.label: t for t in CATALOGUE}
TEXT = BY_LABEL["text"]
INT8 = BY_LABEL["int8"]


@dataclass
class Column:
    name: str
    type: PgType
    key: bool = False
    big: bool = False  # TOAST-sized values that most updates leave alone
    tag: bool = False


@dataclass
class Table:
    schema: str
    name: str
    shape: str
    columns: list[Column]
    rows: Counter[int] = field(default_factory=Counter)  # key number or tag -> copies
    dropped: dict[str, PgType] = field(default_factory=dict)  # a name re-added keeps its old type
    partitions: int = 0  # hash partitions on the first key (or the tag) column; 0: a plain table
    row_filter: sql.Composable | None = None  # the publication's WHERE for this table
    column_list: list[str] | None = None  # the publication's column list for this table
    pinned: set[str] = field(default_factory=set)  # in the filter or the list: never dropped or retyped
    # The insert after an ALTER shows it to every published relation of the table (docs/OPERATING.md, Known
    # limits: the lake learns of a column with the relation's next change); not so through a row
    # filter, or into one of several partitions published each as a table of its own.
    alterable: bool = True

    @property
    def ident(self) -> sql.Identifier:
        return sql.Identifier(self.schema, self.name)

    @property
    def keyed(self) -> bool:
        return self.shape in ("pk", "full_pk")

    @property
    def changeable(self) -> bool:
        """UPDATE and DELETE are allowed: a primary key or REPLICA IDENTITY FULL."""
        return self.shape in ("pk", "full_pk", "full_nokey")

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def leaves(self) -> list[sql.Identifier]:
        """The partitions of a partitioned table (none for a plain one)."""
        return [sql.Identifier(self.schema, f"{self.name} p{r}") for r in range(self.partitions)]

    @property
    def scan(self) -> sql.Composable:
        """This table's own rows: ``ONLY`` skips inheritance children; a partitioned root reads its leaves."""
        return self.ident if self.partitions else sql.SQL("ONLY {}").format(self.ident)


Statement = sql.Composable
Transaction = list[Statement]


def _lit(value: str | None, pgtype: PgType) -> sql.Composable:
    if value is None:
        return sql.SQL("NULL::{}").format(pgtype.sql)
    return sql.SQL("{}::{}").format(sql.Literal(value), pgtype.sql)


class Workload:
    """Schema, initial rows and ``rounds`` rounds of change transactions for one seed."""

    def __init__(self, seed: int, rounds: int = 2) -> None:
        self.seed = seed
        self.rng = rng = Random(seed)
        self.counter = 0
        self.publication = "fidelity pub"
        self.via_root: bool | None = None  # publish_via_partition_root, when set
        schemas = rng.sample(SCHEMAS, rng.randint(1, 2))
        self.setup: list[Statement] = [
            sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(s)) for s in schemas if s != "public"
        ]
        type_ddl, custom = custom_types(schemas[0])
        self.setup += type_ddl
        self.types = CATALOGUE + custom
        names = rng.sample(TABLES, rng.randint(2, 4))
        shapes = [rng.choice(SHAPES) for _ in names]
        if not any(s.startswith("full") for s in shapes):
            shapes[0] = rng.choice(["full_pk", "full_nokey"])  # every seed has a FULL table
        self.tables = [self._table(rng.choice(schemas), n, s) for n, s in zip(names, shapes, strict=True)]
        self._decorate()
        self.setup += [self._create(t) for t in self.tables]
        self.setup.append(self._publication())
        self.initial = [self._initial_rows(t) for t in self.tables]
        self.rounds = [self._round() for _ in range(rounds)]

    # --- schema ---------------------------------------------------------------------------------

    def _table(self, schema: str, name: str, shape: str) -> Table:
        rng = self.rng
        names = iter(rng.sample(COLUMNS, len(COLUMNS)))
        columns: list[Column] = []
        if shape in ("pk", "full_pk"):
            key_types = [rng.choice(KEY_TYPES)] if rng.random() < 0.7 else ["int8", "text"]
            columns += [Column(next(names), BY_LABEL[k], key=True) for k in key_types]
        else:
            columns.append(Column(next(names), INT8, tag=True))
        for pgtype in rng.sample(self.types, rng.randint(4, 8)):
            columns.append(Column(next(names), pgtype))
        if shape.startswith("full") or rng.random() < 0.5:
            columns.insert(rng.randint(1, len(columns)), Column(next(names), TEXT, big=True))
        return Table(schema, name, shape, columns)

    def _decorate(self) -> None:
        """Partitions, row filters, column lists: none here (the crash soak's workload adds them)."""

    def _create(self, t: Table) -> Statement:
        items = [sql.SQL("{} {}").format(sql.Identifier(c.name), c.type.sql) for c in t.columns]
        keys = [sql.Identifier(c.name) for c in t.columns if c.key]
        if keys:
            items.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(keys)))
        statements = [sql.SQL("CREATE TABLE {} ({})").format(t.ident, sql.SQL(", ").join(items))]
        if t.partitions:
            by = next(c for c in t.columns if c.key or c.tag)
            statements[0] = sql.SQL("{} PARTITION BY HASH ({})").format(
                statements[0], sql.Identifier(by.name)
            )
            statements += [
                sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES WITH (MODULUS {}, REMAINDER {})").format(
                    leaf, t.ident, sql.Literal(t.partitions), sql.Literal(r)
                )
                for r, leaf in enumerate(t.leaves)
            ]
        identity = {"full_pk": "FULL", "full_nokey": "FULL", "nokey_nothing": "NOTHING"}.get(t.shape)
        if identity is not None:  # each partition has its own replica identity
            statements += [
                sql.SQL("ALTER TABLE {} REPLICA IDENTITY {}").format(relation, sql.SQL(identity))
                for relation in [t.ident, *t.leaves]
            ]
        return sql.SQL("; ").join(statements)

    def _publication(self) -> Statement:
        items = []
        for t in self.tables:
            item = t.ident
            if t.column_list is not None:
                names = sql.SQL(", ").join(map(sql.Identifier, t.column_list))
                item = sql.SQL("{} ({})").format(item, names)
            if t.row_filter is not None:
                item = sql.SQL("{} WHERE ({})").format(item, t.row_filter)
            items.append(item)
        statement = sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
            sql.Identifier(self.publication), sql.SQL(", ").join(items)
        )
        if self.via_root is None:
            return statement
        return sql.SQL("{} WITH (publish_via_partition_root = {})").format(
            statement, sql.Literal(self.via_root)
        )

    def published(self) -> list[tuple[str, str]]:
        """(schema, table) of every published relation: partitions unless published via their root."""
        out = []
        for t in self.tables:
            relations = t.leaves if t.partitions and not self.via_root else [t.ident]
            out += [(r.strings[0], r.strings[1]) for r in relations]
        return out

    # --- values and row selection ---------------------------------------------------------------

    def _key_value(self, column: Column, n: int) -> str:
        label = column.type.label
        if label in ("int4", "int8"):
            return str(n * 7 - 50)
        if label == "uuid":
            return str(uuid.UUID(int=(n * 0x9E3779B97F4A7C15) % 2**128))
        return f"k{n} {hostile_text(Random(n))}"

    def _value(self, column: Column) -> str | None:
        if column.big:
            return None if self.rng.random() < 0.1 else big_text(self.rng)
        return None if self.rng.random() < 0.15 else column.type.gen(self.rng)

    def _where(self, t: Table, n: int) -> sql.Composable:
        """The row with key number ``n``, or exactly one of the rows tagged ``n``."""
        if t.keyed:
            return sql.SQL(" AND ").join(
                sql.SQL("{} = {}").format(sql.Identifier(c.name), _lit(self._key_value(c, n), c.type))
                for c in t.columns
                if c.key
            )
        tag = next(c for c in t.columns if c.tag)
        return sql.SQL("(tableoid, ctid) = (SELECT tableoid, ctid FROM {} WHERE {} = {} LIMIT 1)").format(
            t.scan, sql.Identifier(tag.name), sql.Literal(n)
        )

    # --- statements -----------------------------------------------------------------------------

    def _row(self, t: Table, value: Callable[[Column], str | None] | None = None) -> sql.Composable:
        """A new row's ``(values)``, recorded in the model; ``value`` draws the non-key values."""
        self.counter += 1
        n = self.counter
        value = value or self._value
        values = [
            _lit(self._key_value(c, n) if c.key else str(n) if c.tag else value(c), c.type) for c in t.columns
        ]
        t.rows[n] += 1
        return sql.SQL("({})").format(sql.SQL(", ").join(values))

    def _insert(self, t: Table) -> Statement:
        row = self._row(t)
        return sql.SQL("INSERT INTO {} ({}) VALUES {}").format(
            t.ident, sql.SQL(", ").join(sql.Identifier(c.name) for c in t.columns), row
        )

    def _duplicate(self, t: Table) -> Statement:
        """An exact copy of an existing row (tables without a key)."""
        n = self.rng.choice(sorted(t.rows))
        t.rows[n] += 1
        return sql.SQL("INSERT INTO {} SELECT * FROM {} WHERE {}").format(t.ident, t.scan, self._where(t, n))

    def _update(self, t: Table) -> Statement:
        rng = self.rng
        n = rng.choice(sorted(t.rows))
        plain = [c for c in t.columns if not (c.key or c.tag or c.big)]
        chosen = rng.sample(plain, rng.randint(1, len(plain))) if plain else []
        sets = [
            sql.SQL("{} = {}").format(sql.Identifier(c.name), _lit(self._value(c), c.type)) for c in chosen
        ]
        big = [c for c in t.columns if c.big]
        if big and rng.random() < 0.15:  # most updates leave the TOAST value unchanged
            sets.append(
                sql.SQL("{} = {}").format(sql.Identifier(big[0].name), _lit(self._value(big[0]), TEXT))
            )
        where = self._where(t, n)
        if t.keyed and (rng.random() < 0.25 or not sets):  # a key change
            self.counter += 1
            sets += [
                sql.SQL("{} = {}").format(
                    sql.Identifier(c.name), _lit(self._key_value(c, self.counter), c.type)
                )
                for c in t.columns
                if c.key
            ]
            t.rows[n] -= 1
            t.rows[self.counter] += 1
        elif not sets:
            tag = next(c for c in t.columns if c.tag)
            sets.append(sql.SQL("{0} = {0}").format(sql.Identifier(tag.name)))
        t.rows += Counter()  # drop zero counts
        return sql.SQL("UPDATE {} SET {} WHERE {}").format(t.ident, sql.SQL(", ").join(sets), where)

    def _delete(self, t: Table) -> Statement:
        n = self.rng.choice(sorted(t.rows))
        t.rows[n] -= 1
        t.rows += Counter()
        return sql.SQL("DELETE FROM {} WHERE {}").format(t.ident, self._where(t, n))

    def _truncate(self, t: Table) -> Statement:
        t.rows.clear()
        return sql.SQL("TRUNCATE {}").format(t.ident)

    def _alter(self, t: Table) -> Statement:
        """A schema change from the safe list, then an insert into the table.

        pgoutput announces a table's new columns only with its next change (docs/OPERATING.md,
        "Known limits"): the insert makes the change reach the stream in the same transaction.
        """
        change = self._schema_change(t)
        return sql.SQL("{}; {}").format(change, self._insert(t))

    def _schema_change(self, t: Table) -> Statement:
        """ADD (with a constant default or none), DROP, or int4 -> int8."""
        rng = self.rng
        taken = {c.name for c in t.columns}
        free = [n for n in COLUMNS + [f"added {i}" for i in range(9)] if n not in taken]
        droppable = [c for c in t.columns if not (c.key or c.tag or c.name in t.pinned)]
        widenable = [c for c in droppable if c.type.widens_to]
        kind = rng.choice(["add_default", "add", "drop", "widen"])
        if kind == "widen" and widenable:
            column = rng.choice(widenable)
            column.type = BY_LABEL[column.type.widens_to or ""]
            return sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE {}").format(
                t.ident, sql.Identifier(column.name), column.type.sql
            )
        if kind == "drop" and len(droppable) > 1:
            column = rng.choice(droppable)
            t.columns.remove(column)
            t.dropped[column.name] = column.type
            return sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(t.ident, sql.Identifier(column.name))
        # A name dropped earlier comes back with its old type: another one is a re-snapshot (Known limits).
        pgtype = t.dropped.get(free[0]) or rng.choice(
            [BY_LABEL[x] for x in ("int4", "text", "numeric(12,3)", "bool")]
        )
        added = Column(free[0], pgtype)
        t.columns.append(added)
        statement = sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
            t.ident, sql.Identifier(added.name), added.type.sql
        )
        if kind == "add":
            return statement
        return sql.SQL("{} DEFAULT {}").format(statement, _lit(added.type.gen(rng), added.type))

    def _operation(self, t: Table) -> Statement | None:
        rng = self.rng
        choices = ["insert"] * 4 + (["alter"] if t.alterable else [])
        if t.rows:
            choices += ["truncate"] if rng.random() < 0.15 else []
            choices += ["update"] * 4 + ["delete"] * 2 if t.changeable else []
            choices += ["duplicate"] * 2 if not t.keyed else []
        op = rng.choice(choices)
        if op == "alter":
            return self._alter(t)
        return {
            "insert": self._insert,
            "duplicate": self._duplicate,
            "update": self._update,
            "delete": self._delete,
            "truncate": self._truncate,
        }[op](t)

    def _ops(self, count: int) -> list[Statement]:
        out = []
        for _ in range(count):
            op = self._operation(self.rng.choice(self.tables))
            if op is not None:
                out.append(op)
        return out

    # --- transactions ---------------------------------------------------------------------------

    def _initial_rows(self, t: Table) -> Transaction:
        statements = [self._insert(t) for _ in range(self.rng.randint(3, 10))]
        if not t.keyed:
            statements += [self._duplicate(t) for _ in range(self.rng.randint(1, 3))]
        return [sql.SQL("BEGIN"), *statements, sql.SQL("COMMIT")]

    def _transaction(self) -> Transaction:
        """A committed transaction, one with a rolled-back savepoint, or an aborted one.

        What is rolled back is generated too, then forgotten by the model (the counter keeps
        going, so later rows never reuse a key the server never saw).
        """
        rng = self.rng
        kind = rng.choices(["plain", "savepoint", "aborted"], weights=[6, 2, 1])[0]
        saved = copy.deepcopy(self.tables)
        statements: Transaction = [sql.SQL("BEGIN"), *self._ops(rng.randint(1, 4))]
        if kind == "aborted":
            self.tables[:] = saved
            return [*statements, sql.SQL("ROLLBACK")]
        if kind == "savepoint":
            saved = copy.deepcopy(self.tables)
            statements += [sql.SQL("SAVEPOINT sp"), *self._ops(rng.randint(1, 3))]
            self.tables[:] = saved
            statements += [sql.SQL("ROLLBACK TO SAVEPOINT sp"), *self._ops(rng.randint(0, 2))]
        return [*statements, sql.SQL("COMMIT")]

    def _round(self) -> list[Transaction]:
        return [self._transaction() for _ in range(self.rng.randint(3, 6))]

    def describe(self) -> str:
        """One line per table: name, shape, columns with their types."""
        return "\n".join(
            f"  {t.qualified!r} [{t.shape}]: "
            + ", ".join(f"{c.name!r} {c.type.label}{' key' if c.key else ''}{' big' if c.big else ''}"
                        for c in t.columns)
            for t in self.tables
        )  # fmt: skip
