"""Column transforms applied to what the drain and the snapshot copy stage (``formats/column_transforms.py``).

A hashed column reaches this step as its PostgreSQL text form: the drain's decoder and the snapshot
plan type it as ``text`` (:meth:`ColumnTransformer.text_columns`, :meth:`ColumnTransformer.plan`),
so the same value gives the same text, and so the same HMAC, in a snapshot and in every batch. A
dropped column is left out of the snapshot's ``SELECT`` and cut from each decoded change before it
is staged. Either way the clear value exists only in the memory of the process that read it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_provider_postgres_cdc.engine.snapshot.plan import TablePlan
from airflow_provider_postgres_cdc.errors import ColumnTransformsError
from airflow_provider_postgres_cdc.formats.column_transforms import (
    ColumnTransforms,
    Transform,
    check_keys,
    check_published,
    hashes_anything,
    key_id,
    named,
    recorded_text,
)
from airflow_provider_postgres_cdc.formats.manifest import TableManifest, sibling_name
from airflow_provider_postgres_cdc.formats.pgtypes import TEXT_OID
from airflow_provider_postgres_cdc.formats.schema_changes import ColumnFacts
from airflow_provider_postgres_cdc.pgoutput.arrow import TableChanges

_OLD = "_pgl_old"
_UNCHANGED = "_pgl_unchanged"


class ColumnTransformer:
    """One run's ``column_transforms`` and hash key; the key stays out of every repr and message."""

    def __init__(self, transforms: ColumnTransforms, key: bytes | None = None) -> None:
        if hashes_anything(transforms) and not key:
            raise ColumnTransformsError(
                "column_transforms hashes columns but no hash key was given: create an Airflow connection "
                "whose password is the secret key (at least 16 random bytes) and pass its id as "
                "hash_key_conn_id; nothing was staged"
            )
        self._transforms = transforms
        self._inner, self._outer = _pads(key or b"")
        self.key_id = key_id(key) if key else None

    def __repr__(self) -> str:
        return f"ColumnTransformer(tables={sorted(self._transforms)}, key_id={self.key_id})"

    @property
    def transforms(self) -> ColumnTransforms:
        return self._transforms

    def columns(self, qualified: str) -> dict[str, Transform]:
        return self._transforms.get(qualified, {})

    def text_columns(self) -> dict[str, frozenset[str]]:
        """The hashed columns by ``schema.table``: the decoder stages them as their text form."""
        return {table: named(columns, "hash") for table, columns in self._transforms.items()}

    def check_published(self, published: Iterable[tuple[str, Iterable[str]]]) -> None:
        check_published(self._transforms, published)

    def recorded(self, spec: TableManifest) -> TableManifest:
        """``spec`` with what its staged values were transformed by."""
        return dataclasses.replace(
            spec, column_transforms=recorded_text(self.columns(spec.qualified), self.key_id)
        )

    def hash_values(self, values: pa.Array) -> pa.Array:
        """The lowercase hex HMAC-SHA256 of each text (or, from a SQL_ASCII database, byte) value.

        Each distinct value is hashed once (a batch repeats values: dates, countries, one
        customer's changes), and each hash starts from copies of the key's two padded states."""
        encoded = values.dictionary_encode()
        inner, outer = self._inner, self._outer
        hashed = []
        for value in encoded.dictionary.to_pylist():
            first = inner.copy()
            first.update(value.encode() if isinstance(value, str) else value)
            second = outer.copy()
            second.update(first.digest())
            hashed.append(second.hexdigest())
        return pa.array(hashed, pa.string()).take(encoded.indices)

    # ------------------------------------------------------------------------------ the drain

    def changes(self, changes: TableChanges) -> TableChanges:
        """One relation version's decoded changes, transformed (its hashed columns already text)."""
        relation = changes.relation
        qualified = f"{relation.namespace}.{relation.name}"
        columns = self.columns(qualified)
        if not columns:
            return changes
        check_keys(qualified, columns, [c.name for c in relation.columns if c.is_key])
        dropped, hashed = named(columns, "drop"), named(columns, "hash")
        gone = dropped | {sibling_name(name) for name in dropped}
        kept = tuple(c for c in relation.columns if c.name not in dropped)
        return TableChanges(
            dataclasses.replace(relation, columns=kept),
            [self._change_batch(batch, hashed, gone) for batch in changes.batches],
        )

    def _change_batch(
        self, batch: pa.RecordBatch, hashed: AbstractSet[str], gone: AbstractSet[str]
    ) -> pa.RecordBatch:
        fields, arrays = self._columns(batch.schema, batch.columns, hashed, gone)
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields, metadata=batch.schema.metadata))

    def _columns(
        self,
        fields: Iterable[pa.Field],
        arrays: Iterable[pa.Array],
        hashed: AbstractSet[str],
        gone: AbstractSet[str],
    ) -> tuple[list[pa.Field], list[pa.Array]]:
        """Fields and arrays without the ``gone`` ones, the ``hashed`` ones hashed; in a change
        table, the same inside its old tuples and out of its unchanged-TOAST lists."""
        kept_fields, kept = [], []
        for field, array in zip(fields, arrays, strict=True):
            if field.name in gone:
                continue
            if field.name in hashed:
                array = self.hash_values(array)
            elif field.name == _OLD:
                old_fields, children = self._columns(array.type, array.flatten(), hashed, gone)
                array = pa.StructArray.from_arrays(children, fields=old_fields, mask=array.is_null())
            elif field.name == _UNCHANGED:
                array = _without_names(array, gone)
            kept_fields.append(field.with_type(array.type))
            kept.append(array)
        return kept_fields, kept

    # ------------------------------------------------------------------------ the snapshot copy

    def plan(self, plan: TablePlan) -> TablePlan:
        """The plan copying hashed columns as text and leaving dropped ones out of its ``SELECT``."""
        columns = self.columns(plan.qualified)
        if not columns:
            return plan
        check_keys(plan.qualified, columns, plan.key_columns)
        kept = tuple(
            dataclasses.replace(c, type_oid=TEXT_OID, typmod=-1) if columns.get(c.name) == "hash" else c
            for c in plan.columns
            if columns.get(c.name) != "drop"
        )
        return dataclasses.replace(plan, columns=kept)

    def snapshot_batch(self, plan: TablePlan, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A copied record batch with its hashed columns (typed as text by :meth:`plan`) hashed."""
        hashed = named(self.columns(plan.qualified), "hash")
        return self._change_batch(batch, hashed, set()) if hashed else batch

    # ---------------------------------------------------------------------- the catalog facts

    def facts(self, qualified: str, facts: Mapping[str, ColumnFacts]) -> dict[str, ColumnFacts]:
        """A table's catalog facts without dropped columns, a hashed column's missing value hashed."""
        columns = self.columns(qualified)
        out = {}
        for name, column in facts.items():
            if columns.get(name) == "drop":
                continue
            if columns.get(name) == "hash" and column.missing is not None:
                column = dataclasses.replace(
                    column, missing=self.hash_values(pa.array([column.missing]))[0].as_py()
                )
            out[name] = column
        return out


def _without_names(lists: pa.ListArray, names: AbstractSet[str]) -> pa.ListArray:
    """Each list of column names without ``names`` (the unchanged-TOAST lists of dropped columns)."""
    flat = lists.flatten()
    if not names or not len(flat):
        return lists
    keep = pc.invert(pc.is_in(flat, value_set=pa.array(sorted(names), pa.string()))).to_numpy(
        zero_copy_only=False
    )
    parents = pc.list_parent_indices(lists).to_numpy()
    counts = np.bincount(parents[keep], minlength=len(lists))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), flat.filter(pa.array(keep)), type=lists.type)


def _pads(key: bytes) -> tuple[Any, Any]:
    """HMAC-SHA256's inner and outer SHA-256 states after the padded key (RFC 2104), computed once:
    ``hmac.digest`` sets the key up again for every value, which costs more than the hashing."""
    block = hashlib.sha256().block_size
    key = (hashlib.sha256(key).digest() if len(key) > block else key).ljust(block, b"\0")
    return hashlib.sha256(bytes(b ^ 0x36 for b in key)), hashlib.sha256(bytes(b ^ 0x5C for b in key))
