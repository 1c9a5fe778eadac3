"""``PostgresCdcHashKeyHook``: the secret key of ``column_transforms``, a connection's password.

Any connection type serves (``generic`` is the plain one); only its password is read. Airflow masks
a connection's password in task logs once it is read, and this package never logs or stages it:
a lake table records only a public identifier of the key (``formats/column_transforms.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from airflow_provider_postgres_cdc.errors import ColumnTransformsError
from airflow_provider_postgres_cdc.formats.column_transforms import hashes_anything, parse_column_transforms

if TYPE_CHECKING:  # the engine's module loads pyarrow: imported when a task runs, not at parse
    from airflow_provider_postgres_cdc.engine.column_hashing import ColumnTransformer

MIN_KEY_BYTES = 16


class PostgresCdcHashKeyHook(BaseHook):
    """The HMAC key of ``column_transforms``: the password of a connection::

        AIRFLOW_CONN_POSTGRES_CDC_HASH_KEY='{"conn_type": "generic", "password": "<32 random bytes, base64>"}'

    :param hash_key_conn_id: the Airflow connection id.
    """

    conn_name_attr = "hash_key_conn_id"
    default_conn_name = "postgres_cdc_hash_key"
    conn_type = "generic"
    hook_name = "Column hash key (Postgres CDC)"

    def __init__(self, hash_key_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hash_key_conn_id = hash_key_conn_id

    def get_conn(self) -> bytes:
        """The key's bytes; :class:`ColumnTransformsError` when the connection or its password is missing."""
        try:
            conn = self.get_connection(self.hash_key_conn_id)
        except AirflowNotFoundException:
            raise ColumnTransformsError(
                f"column_transforms hashes columns under the key in connection {self.hash_key_conn_id!r}, "
                "which does not exist: create it (conn_type 'generic') with the secret key as its password, "
                "or pass another hash_key_conn_id; nothing was staged"
            ) from None
        key = (conn.password or "").encode()
        if len(key) < MIN_KEY_BYTES:
            raise ColumnTransformsError(
                f"connection {self.hash_key_conn_id!r} holds no hash key of at least {MIN_KEY_BYTES} bytes "
                "in its password: set one (e.g. 32 random bytes, base64); nothing was staged"
            )
        return key


def column_transformer(
    option: str | Mapping[str, Mapping[str, str]] | None, hash_key_conn_id: str | None
) -> ColumnTransformer | None:
    """The transforms a drain or snapshot task stages under, with their key; None when there are none."""
    transforms = parse_column_transforms(option)
    if not transforms:
        return None
    from airflow_provider_postgres_cdc.engine.column_hashing import ColumnTransformer

    if not hashes_anything(transforms):
        return ColumnTransformer(transforms)
    hook = PostgresCdcHashKeyHook(hash_key_conn_id or PostgresCdcHashKeyHook.default_conn_name)
    return ColumnTransformer(transforms, hook.get_conn())
