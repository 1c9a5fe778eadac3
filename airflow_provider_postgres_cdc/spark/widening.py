"""Which type a lake column must take to hold a batch's staged values: the promotions Iceberg allows."""

from __future__ import annotations

from pyspark.sql.types import (
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
)

_INTEGRAL: dict[type[DataType], int] = {ByteType: 1, ShortType: 2, IntegerType: 4, LongType: 8}
_FLOATING: dict[type[DataType], int] = {FloatType: 4, DoubleType: 8}


def widened(table_type: DataType, staged: DataType) -> DataType | None:
    """The type a lake column must take to hold ``staged`` values; None when it already can.

    Raises :class:`ValueError` when no promotion Iceberg allows gets there (int to long, float to
    double, a larger decimal precision with the same scale; smaller integers are upcast on write).
    """
    if table_type == staged:
        return None
    for family in (_INTEGRAL, _FLOATING):
        if type(table_type) not in family or type(staged) not in family:
            continue
        if family[type(staged)] <= family[type(table_type)]:
            return None
        return LongType() if family is _INTEGRAL else DoubleType()
    decimals = isinstance(table_type, DecimalType) and isinstance(staged, DecimalType)
    if decimals and table_type.scale == staged.scale:  # type: ignore[attr-defined]
        return None if staged.precision <= table_type.precision else staged  # type: ignore[attr-defined]
    raise ValueError(f"{table_type.simpleString()} cannot hold {staged.simpleString()}")
