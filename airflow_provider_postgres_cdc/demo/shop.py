"""A small, realistic shop schema and a workload that exercises everything CDC must get right.

Used by ``make demo`` and the end-to-end tests. Each :meth:`ShopWorkload.step` commits a
mix of transactions: inserts, updates, deletes, primary-key changes, updates that leave a
TOAST-sized column untouched (sent as "unchanged"), a REPLICA IDENTITY FULL table without a
key, a TRUNCATE followed by inserts in the same transaction, and values that are easy to get
wrong (JSON ``null``, empty arrays, NaN, infinity, unicode, bytea).
"""

from __future__ import annotations

import random
from typing import Any

import psycopg2

PUBLICATION = "shop_pub"
TABLES = (
    "public.customers",
    "public.products",
    "public.orders",
    "public.order_items",
    "public.carts",
    "public.stock_moves",
)

SCHEMA_SQL = """
CREATE TABLE customers (
    id bigint PRIMARY KEY,
    email text NOT NULL,
    name text,
    created_at timestamptz NOT NULL,
    profile jsonb,
    tags text[],
    score double precision
);
CREATE TABLE products (
    sku text PRIMARY KEY,
    title text NOT NULL,
    price numeric(12, 2) NOT NULL,
    description text,
    thumbnail bytea,
    updated_at timestamptz
);
ALTER TABLE products ALTER COLUMN description SET STORAGE EXTERNAL;
CREATE TABLE orders (
    id bigint PRIMARY KEY,
    customer_id bigint NOT NULL,
    status text NOT NULL,
    total numeric(12, 2),
    placed_at timestamptz NOT NULL,
    ship_by date,
    notes text
);
CREATE TABLE order_items (
    order_id bigint,
    line_no int,
    sku text NOT NULL,
    qty int NOT NULL,
    unit_price numeric(12, 2) NOT NULL,
    PRIMARY KEY (order_id, line_no)
);
CREATE TABLE carts (customer_id bigint PRIMARY KEY, items int NOT NULL, touched_at timestamptz);
CREATE TABLE stock_moves (sku text NOT NULL, delta int NOT NULL, moved_at timestamptz NOT NULL, note text);
ALTER TABLE stock_moves REPLICA IDENTITY FULL;
"""


class ShopWorkload:
    """Generates the schema, an initial load and then rounds of mixed changes, deterministically."""

    def __init__(self, dsn: str, seed: int = 7) -> None:
        self.dsn = dsn
        self.rng = random.Random(seed)
        self.next_customer = 1
        self.next_order = 1
        self.round = 0

    def _run(self, statements: list[tuple[str, Any]]) -> None:
        """Run the statements as one transaction."""
        conn = psycopg2.connect(self.dsn)
        try:
            with conn, conn.cursor() as cur:
                for statement, args in statements:
                    cur.execute(statement, args)
        finally:
            conn.close()

    def create_schema(self) -> None:
        self._run(
            [(SCHEMA_SQL, None), (f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(TABLES)}", None)]
        )

    def _customers(self, count: int) -> list[tuple[str, Any]]:
        rows: list[tuple[str, Any]] = []
        for _ in range(count):
            cid = self.next_customer
            self.next_customer += 1
            tags = self.rng.choice([[], ["vip"], ["new", "ünïcødé"], None])
            profile = self.rng.choice(['{"newsletter": true}', "null", None, '{"a": [1, 2, {"b": null}]}'])
            score = self.rng.choice([1.5, float("nan"), float("inf"), None, -0.0])
            rows.append(
                (
                    "INSERT INTO customers VALUES (%s, %s, %s, now() - %s * interval '1 hour', %s, %s, %s)",
                    (cid, f"c{cid}@example.com", f"Customer {cid}", cid, profile, tags, score),
                )
            )
        return rows

    def _orders(self, count: int) -> list[tuple[str, Any]]:
        rows: list[tuple[str, Any]] = []
        for _ in range(count):
            oid = self.next_order
            self.next_order += 1
            customer = self.rng.randint(1, max(1, self.next_customer - 1))
            lines = self.rng.randint(1, 4)
            rows.append(
                (
                    "INSERT INTO orders VALUES (%s, %s, 'new', NULL, now(), current_date + %s, %s)",
                    (oid, customer, self.rng.randint(1, 9), self.rng.choice([None, "", "leave at door"])),
                )
            )
            for line in range(1, lines + 1):
                sku = f"SKU-{self.rng.randint(1, 40):03d}"
                rows.append(
                    (
                        "INSERT INTO order_items SELECT %s, %s, sku, %s, price FROM products WHERE sku = %s",
                        (oid, line, self.rng.randint(1, 5), sku),
                    )
                )
            rows.append(
                (
                    "UPDATE orders SET total = "
                    "(SELECT sum(qty * unit_price) FROM order_items WHERE order_id = %s) WHERE id = %s",
                    (oid, oid),
                )
            )
        return rows

    def initial_load(self) -> None:
        """Products (with TOAST-sized descriptions), customers and orders before the snapshot."""
        products = [
            (
                "INSERT INTO products VALUES (%s, %s, %s, %s, %s, now())",
                (
                    f"SKU-{n:03d}",
                    f"Product {n}",
                    round(self.rng.uniform(1, 500), 2),
                    f"Long description {n} " + "lorem ipsum " * 800,
                    bytes(range(n % 7, n % 7 + 16)),
                ),
            )
            for n in range(1, 41)
        ]
        self._run(products)
        self._run(self._customers(200))
        self._run(self._orders(300))
        self._run([("INSERT INTO carts SELECT id, 1, now() FROM customers WHERE id % 5 = 0", None)])
        self._run([("INSERT INTO stock_moves SELECT sku, 100, now(), 'initial' FROM products", None)])

    def step(self) -> None:
        """One round of mixed transactions (see the module docstring)."""
        self.round += 1
        self._run(self._customers(20) + self._orders(40))
        self._run(
            [
                (
                    "UPDATE orders SET status = 'shipped' WHERE status = 'new' AND id %% 3 = %s",
                    (self.round % 3,),
                ),
                # Touches price only: the TOAST-ed description travels as 'unchanged'.
                ("UPDATE products SET price = price + 1, updated_at = now() WHERE sku <= %s", ("SKU-010",)),
                (
                    "UPDATE customers SET profile = 'null', tags = '{}' WHERE id %% 17 = %s",
                    (self.round % 17,),
                ),
            ]
        )
        oldest = self.rng.randint(1, max(1, self.next_order - 50))
        self._run(
            [
                ("DELETE FROM order_items WHERE order_id BETWEEN %s AND %s", (oldest, oldest + 4)),
                ("DELETE FROM orders WHERE id BETWEEN %s AND %s", (oldest, oldest + 4)),
            ]
        )
        moved = self.next_order + 100_000
        self.next_order += 1
        self._run(
            [
                # A primary-key change: the old key must disappear from the target.
                ("UPDATE order_items SET order_id = %s WHERE order_id = %s", (moved, self.next_order - 2)),
                ("UPDATE orders SET id = %s WHERE id = %s", (moved, self.next_order - 2)),
            ]
        )
        self._run(
            [
                ("TRUNCATE carts", None),
                ("INSERT INTO carts SELECT id, %s, now() FROM customers WHERE id %% 7 = 0", (self.round,)),
                ("UPDATE carts SET items = items + 1 WHERE customer_id % 14 = 0", None),
            ]
        )
        self._run(
            [
                (
                    "INSERT INTO stock_moves VALUES (%s, %s, now(), %s)",
                    ("SKU-001", -self.round, f"round {self.round}"),
                ),
                ("UPDATE stock_moves SET note = 'checked' WHERE note = 'initial' AND sku = %s", ("SKU-002",)),
                ("DELETE FROM stock_moves WHERE note = %s", (f"round {self.round - 1}",)),
            ]
        )
