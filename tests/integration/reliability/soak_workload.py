"""The crash soak's workload: the fidelity generator plus what only the soak's cluster can run.

On top of ``workload.Workload`` (whose random stream it leaves alone for the fidelity test):

* hash-partitioned tables (2 or 3 partitions on the first key column, or on the tag of a keyless
  table), published with ``publish_via_partition_root`` on or off, chosen per seed;
* row filters (on the replica identity: a key column, the tag, or any column of a REPLICA
  IDENTITY FULL table) and column lists (keys or tag plus some columns; never on FULL tables,
  whose every UPDATE PostgreSQL would then refuse); PostgreSQL 15 allows neither on a
  partitioned table published through its partitions. Their columns are never dropped or retyped
  (PostgreSQL refuses that while a publication depends on them). Such tables, and partitioned
  tables published through their partitions, get no ALTER TABLE: the insert that follows one
  would not reach every published relation, and the lake learns of a column only with its
  relation's next change (docs/OPERATING.md, "Known limits");
* prepared transactions (``PREPARE TRANSACTION``, then ``COMMIT PREPARED`` or ``ROLLBACK
  PREPARED`` as the writer's next transaction, so a drain may run while one is pending);
* transactions larger than ``logical_decoding_work_mem`` (the soak's cluster sets 64 kB): a
  multi-row INSERT of 1,500-3,000 rows, then an UPDATE of every row of the table, committed,
  rolled back, or rolled back to a savepoint.
"""

from __future__ import annotations

import copy

from psycopg2 import sql

from tests.integration.fidelity.workload import BY_LABEL, Column, Table, Transaction, Workload, _lit, big_text

SPLIT = {  # a row filter on a key column of each key type: about half of the rows pass
    "int4": "{} % 3 <> 0",
    "int8": "{} % 3 <> 0",
    "text": "{} < 'k5' COLLATE \"C\"",
    "uuid": "{} < '80000000-0000-0000-0000-000000000000'::uuid",
}


class SoakWorkload(Workload):
    """``Workload`` with partitions, row filters, column lists, prepared and large transactions."""

    def __init__(self, seed: int, rounds: int = 2) -> None:
        self.prepared = 0
        super().__init__(seed, rounds)

    def _decorate(self) -> None:
        rng = self.rng
        self.via_root = rng.random() < 0.5
        for t in self.tables:
            if rng.random() < 0.4:
                t.partitions = rng.randint(2, 3)
            if t.partitions and not self.via_root:
                continue
            if rng.random() < 0.35:
                self._filter(t)
            if t.shape in ("pk", "nokey_default", "nokey_nothing") and rng.random() < 0.35:
                anchor = [c.name for c in t.columns if c.key or c.tag]
                others = [c.name for c in t.columns if not (c.key or c.tag)]
                chosen = set(self.rng.sample(others, self.rng.randint(1, max(1, len(others) - 1))))
                t.column_list = anchor + [n for n in others if n in chosen]
                t.pinned |= set(t.column_list)
        for t in self.tables:
            t.alterable = t.row_filter is None and not (t.partitions and not self.via_root)

    def _filter(self, t: Table) -> None:
        anchor = next(c for c in t.columns if c.key or c.tag)
        # A filter may not use user-defined types: only the catalogue's built-in ones.
        plain = [c for c in t.columns if not (c.key or c.tag or c.big) and c.type.label in BY_LABEL]
        if t.shape.startswith("full") and plain and self.rng.random() < 0.5:
            column = self.rng.choice(plain)  # FULL identity covers every column
            t.row_filter = sql.SQL("{} IS NOT NULL").format(sql.Identifier(column.name))
            t.pinned.add(column.name)
            return
        label = "int8" if anchor.tag else anchor.type.label
        t.row_filter = sql.SQL(SPLIT[label]).format(sql.Identifier(anchor.name))

    # --- transactions -----------------------------------------------------------------------------

    def _round(self) -> list[Transaction]:
        out: list[Transaction] = []
        for _ in range(self.rng.randint(3, 6)):
            kind = self.rng.choices(["base", "prepared", "large"], weights=[8, 2, 1])[0]
            if kind == "prepared":
                out += self._prepared()
            elif kind == "large":
                out.append(self._large())
            else:
                out.append(self._transaction())
        return out

    def _prepared(self) -> list[Transaction]:
        """A prepared transaction, and its COMMIT or ROLLBACK PREPARED as the next transaction."""
        self.prepared += 1
        gid = sql.Literal(f"pgl soak {self.seed} {self.prepared}")
        saved = copy.deepcopy(self.tables)
        body = [
            sql.SQL("BEGIN"),
            *self._ops(self.rng.randint(1, 4)),
            sql.SQL("PREPARE TRANSACTION {}").format(gid),
        ]
        if self.rng.random() < 0.3:
            self.tables[:] = saved
            return [body, [sql.SQL("ROLLBACK PREPARED {}").format(gid)]]
        return [body, [sql.SQL("COMMIT PREPARED {}").format(gid)]]

    def _bulk_value(self, column: Column) -> str | None:
        """Few TOAST-sized values in a bulk insert: thousands of them would only slow the soak down."""
        if column.big:
            return big_text(self.rng) if self.rng.random() < 0.02 else None
        return self._value(column)

    def _large(self) -> Transaction:
        """Thousands of changes in one transaction: spilled or streamed by the server."""
        rng = self.rng
        ending = rng.choices(["commit", "rollback", "savepoint"], weights=[3, 1, 1])[0]
        before = self._ops(1) if ending == "savepoint" else []  # kept: it runs before the savepoint
        t = rng.choice(self.tables)
        saved = copy.deepcopy(self.tables)
        rows = [self._row(t, self._bulk_value) for _ in range(rng.randint(1500, 3000))]
        statements: Transaction = [
            sql.SQL("INSERT INTO {} ({}) VALUES {}").format(
                t.ident,
                sql.SQL(", ").join(sql.Identifier(c.name) for c in t.columns),
                sql.SQL(", ").join(rows),
            )
        ]
        plain = [c for c in t.columns if not (c.key or c.tag or c.big)]
        if t.changeable and plain:
            column = rng.choice(plain)
            statements.append(
                sql.SQL("UPDATE {} SET {} = {}").format(
                    t.ident, sql.Identifier(column.name), _lit(self._value(column), column.type)
                )
            )
        if ending == "commit":
            return [sql.SQL("BEGIN"), *statements, sql.SQL("COMMIT")]
        self.tables[:] = saved
        if ending == "rollback":
            return [sql.SQL("BEGIN"), *statements, sql.SQL("ROLLBACK")]
        return [
            sql.SQL("BEGIN"), *before, sql.SQL("SAVEPOINT big"), *statements,
            sql.SQL("ROLLBACK TO SAVEPOINT big"), sql.SQL("COMMIT"),
        ]  # fmt: skip

    def describe(self) -> str:
        """The fidelity description, with each table's partitions, filter and column list."""
        lines = super().describe().splitlines()
        for i, t in enumerate(self.tables):
            extras = []
            if t.partitions:
                extras.append(f"{t.partitions} partitions")
            if t.row_filter is not None:
                extras.append("row filter")
            if t.column_list is not None:
                extras.append(f"columns {t.column_list}")
            if extras:
                lines[i] += " {" + ", ".join(extras) + "}"
        return "\n".join(lines) + f"\n  publish_via_partition_root = {self.via_root}"
