"""The relation cache: relation id -> the Relation message in force, plus announced custom types."""

from __future__ import annotations

from airflow_provider_postgres_cdc.pgoutput.messages import Relation, Type


class RelationCache:
    """Follows Relation and Type messages as they arrive mid-stream.

    pgoutput announces a relation before its first change in a session and again after any
    ALTER TABLE (or, in a streamed transaction, once per transaction), so the entry in force when
    a change arrives is the shape to decode it with. A repeated announcement of the same shape
    keeps the entry, so callers can tell real shape changes apart.
    """

    def __init__(self) -> None:
        self._relations: dict[int, Relation] = {}
        self.types: dict[int, Type] = {}

    def add(self, relation: Relation) -> bool:
        """Record a Relation message; returns True when it changed the relation's shape."""
        current = self._relations.get(relation.relation_id)
        if current is not None and current.same_shape(relation):
            return False
        self._relations[relation.relation_id] = relation
        return True

    def add_type(self, message: Type) -> None:
        self.types[message.type_oid] = message

    def __contains__(self, relation_id: object) -> bool:
        return relation_id in self._relations

    def __getitem__(self, relation_id: int) -> Relation:
        return self._relations[relation_id]

    def snapshot(self) -> dict[int, Relation]:
        """The relations in force now (a copy)."""
        return dict(self._relations)

    def get(self, relation_id: int) -> Relation | None:
        return self._relations.get(relation_id)
