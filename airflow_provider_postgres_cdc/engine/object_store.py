"""Staging on S3-compatible object stores with explicit credentials, and the access check before any work.

pyarrow reads credentials from the environment by default (``AWS_*``), which is what a worker with
an instance role wants. A pipeline that names its store in an Airflow connection instead gets an
:class:`S3Options` (``hooks/staging.py`` builds it from an ``aws`` connection), and every staging
user (drain, snapshot, retention, the ack's and the apply operator's manifest reads) opens the
store through :meth:`S3Options.filesystem`. The secret lives only in that object: its ``repr``
leaves it out, and errors name the endpoint and the key id, never the secret.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import Literal

import pyarrow.fs as pafs

from airflow_provider_postgres_cdc.errors import StagingAccessError

# Fragments of pyarrow's S3 errors that mean "these credentials are refused".
_REFUSED = ("ACCESS_DENIED", "InvalidAccessKeyId", "INVALID_ACCESS_KEY_ID", "SignatureDoesNotMatch", "403")


@dataclass(frozen=True, slots=True)
class S3Options:
    """Where an S3-compatible store is and who we are there (the Amazon provider's ``aws`` connection fields).

    :param access_key: access key id (``None``: pyarrow's default chain: environment, profile, role).
    :param secret_key: secret access key (never printed).
    :param session_token: temporary session token, with temporary keys.
    :param region: region name (``us-east-1`` when a custom endpoint is given without one).
    :param endpoint_url: a custom endpoint (``http://127.0.0.1:8333``, MinIO, SeaweedFS, Ceph, R2, ...).
    """

    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str | None = None
    endpoint_url: str | None = None

    def filesystem(self) -> pafs.S3FileSystem:
        """pyarrow's ``S3FileSystem`` with these settings (nothing is contacted yet)."""
        kwargs: dict[str, object] = {}
        if self.access_key:
            kwargs.update(access_key=self.access_key, secret_key=self.secret_key or "")
            if self.session_token:
                kwargs["session_token"] = self.session_token
        if self.endpoint_url:
            parsed = urllib.parse.urlsplit(self.endpoint_url)
            kwargs.update(endpoint_override=parsed.netloc or parsed.path, scheme=parsed.scheme or "https")
        region = self.region or ("us-east-1" if self.endpoint_url else None)
        if region:
            kwargs["region"] = region
        return pafs.S3FileSystem(**kwargs)  # type: ignore[arg-type]

    def spark_hadoop_conf(self, bucket: str) -> dict[str, str]:
        """The Spark settings with which Hadoop's ``s3a`` reads ``bucket`` as this store (per-bucket keys).

        Spark's executors read staged files through ``s3a`` (``s3://`` paths too); the settings are
        the bucket's own (``fs.s3a.bucket.<bucket>.*``), so the cluster's settings for other
        buckets, the warehouse's for one, stay as they are. A custom endpoint is an S3-compatible
        store (MinIO, SeaweedFS, Ceph), addressed path-style. Without keys, s3a's default chain
        (environment, instance role) applies. The secret key and session token are secrets
        (``engine/spark_conf.py`` keeps them off the command line).
        """
        prefix = f"spark.hadoop.fs.s3a.bucket.{bucket}."
        conf = {"spark.hadoop.fs.s3.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
        if self.endpoint_url:
            conf[prefix + "endpoint"] = self.endpoint_url
            conf[prefix + "path.style.access"] = "true"
            conf[prefix + "connection.ssl.enabled"] = str(self.endpoint_url.startswith("https")).lower()
        region = self.region or ("us-east-1" if self.endpoint_url else None)
        if region:
            conf[prefix + "endpoint.region"] = region
        if self.access_key:
            conf[prefix + "access.key"] = self.access_key
            conf[prefix + "secret.key"] = self.secret_key or ""
            if self.session_token:
                conf[prefix + "session.token"] = self.session_token
                conf[prefix + "aws.credentials.provider"] = (
                    "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
                )
            else:
                conf[prefix + "aws.credentials.provider"] = (
                    "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
                )
        return conf

    def scrub(self, text: str) -> str:
        """``text`` with the secret and the session token replaced (defence in depth for messages)."""
        for secret in (self.secret_key, self.session_token):
            if secret:
                text = text.replace(secret, "***")
        return text


@dataclass(frozen=True, slots=True)
class BucketProblem:
    """Why a bucket cannot be used: ``missing``, ``refused`` (the credentials) or ``unreachable``."""

    kind: Literal["missing", "refused", "unreachable"]
    detail: str = ""


def bucket_problem(filesystem: pafs.FileSystem, bucket: str) -> BucketProblem | None:
    """What keeps ``bucket`` from being used through ``filesystem`` (one HEAD request), or None."""
    try:
        info = filesystem.get_file_info(bucket)
    except OSError as exc:
        detail = str(exc)
        return BucketProblem("refused" if any(f in detail for f in _REFUSED) else "unreachable", detail)
    return BucketProblem("missing") if info.type == pafs.FileType.NotFound else None


def check_access(filesystem: pafs.FileSystem, root: str, uri: str, options: S3Options | None = None) -> None:
    """Raise :class:`StagingAccessError` unless the bucket of ``root`` exists and answers these credentials.

    Called before a drain, snapshot or retention run touches anything, so a wrong bucket or key
    stops it with nothing moved (no slot created or advanced, nothing staged or deleted). Local
    and HDFS roots are not checked here: their write errors say enough.
    """
    kind = str(filesystem.type_name)
    if kind not in ("s3", "gcs"):
        return
    bucket = root.strip("/").split("/", 1)[0]
    where = f" at {options.endpoint_url}" if options is not None and options.endpoint_url else ""
    key = f" with access key id {options.access_key!r}" if options is not None and options.access_key else ""
    problem = bucket_problem(filesystem, bucket)
    if problem is None:
        return
    detail = options.scrub(problem.detail) if options is not None else problem.detail
    if problem.kind == "refused":
        raise StagingAccessError(
            f"the object store{where} refused access to bucket {bucket!r} of staging {uri}{key} "
            f"({detail}): "
            "check the staging connection's access key id and secret (login and password of its aws "
            "connection) and the bucket's policy. Nothing was staged and the slot did not move."
        )
    if problem.kind == "unreachable":
        raise StagingAccessError(
            f"cannot reach bucket {bucket!r} of staging {uri}{where} ({detail}): check the endpoint and the "
            "network. Nothing was staged and the slot did not move."
        )
    raise StagingAccessError(
        f"bucket {bucket!r} of staging {uri} does not exist{where}: create it (or correct the staging "
        "URI); the pipeline never creates buckets. Nothing was staged and the slot did not move."
    )
