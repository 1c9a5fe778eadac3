"""Spark SQL text the jobs build: quoted names, string literals, column types and temporary views."""

from __future__ import annotations

import uuid

from pyspark.sql import DataFrame
from pyspark.sql.types import ArrayType, DataType, MapType, StructType


def quote(name: str) -> str:
    """A Spark SQL identifier part: backticks, with backticks inside doubled."""
    return "`" + name.replace("`", "``") + "`"


def literal(text: str) -> str:
    """A Spark SQL string literal (backslashes and quotes escaped: Spark unescapes literals)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def ddl_type(dtype: DataType) -> str:
    """``dtype`` as DDL (``ALTER TABLE ... ADD COLUMN``) takes it, nested field names quoted."""
    if isinstance(dtype, StructType):
        return "struct<" + ", ".join(f"{quote(f.name)}: {ddl_type(f.dataType)}" for f in dtype.fields) + ">"
    if isinstance(dtype, ArrayType):
        return f"array<{ddl_type(dtype.elementType)}>"
    if isinstance(dtype, MapType):
        return f"map<{ddl_type(dtype.keyType)}, {ddl_type(dtype.valueType)}>"
    return dtype.simpleString()


def temp_view(df: DataFrame) -> str:
    """Register ``df`` under a fresh temporary view name."""
    name = f"pgl_src_{uuid.uuid4().hex}"
    df.createOrReplaceTempView(name)
    return name
