"""The lake's failures inside a Spark job, as the package's errors: what to check, and that the slot stayed.

Spark reports a warehouse bucket that does not exist, S3 keys the store refuses or a catalog that
went away mid-job as a Java exception several causes deep, under a stack trace of a hundred
lines. :func:`lake_failure` reads the text of that chain (``job.run_job`` hands it every failure
that is not already one of the package's) and recognises those causes by the exception classes
and codes of the AWS SDK, Hadoop's ``s3a`` and Iceberg's REST and JDBC clients. It returns the
package's error for them, naming what to check, with the Java cause's own line; anything else
stays an unexpected failure. A job never acknowledges a batch: whatever failed, the slot did not
move, and a re-run skips what the lake already holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from airflow_provider_postgres_cdc.errors import (
    CatalogError,
    LakeStorageError,
    PostgresCdcError,
    StagingAccessError,
)

SLOT_STAYED = (
    "Nothing was acknowledged: the slot did not move. Run the task again once this is fixed: "
    "what the lake holds already is skipped."
)

_MISSING_BUCKET = re.compile(
    r"NoSuchBucket|UnknownStoreException|specified bucket does not exist|[Bb]ucket \S+ does not exist"
)
_REFUSED = re.compile(
    r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|Access Denied|ExpiredToken|InvalidToken"
    r"|Status Code: 403|403 Forbidden"
)
_OBJECT_STORE = re.compile(r"Service: S3|S3Exception|amazonaws|\bs3a?://|fs\.s3a")
_CATALOG = re.compile(
    r"org\.apache\.iceberg\.exceptions\.(RESTException|ServiceUnavailableException|ServiceFailureException"
    r"|NotAuthorizedException|ForbiddenException|CommitStateUnknownException)"
    r"|org\.apache\.iceberg\.jdbc\.UncheckedSQLException"
)
_S3_URL = re.compile(r"\bs3a?://([a-z0-9][a-z0-9.\-]{1,62})(/[^\s'\"`:,)]*)?")


@dataclass(frozen=True, slots=True)
class JobLake:
    """What a job knows of where it writes and reads, for the messages (no secret among it).

    :param catalog: the Spark catalog name of the lake.
    :param catalog_uri: the catalog's ``uri`` property ("" when it has none).
    :param warehouse: the catalog's ``warehouse`` property.
    :param staging: where the job's staged input lies (its manifest's directory), "" for none.
    """

    catalog: str
    catalog_uri: str = ""
    warehouse: str = ""
    staging: str = ""


def java_text(exc: BaseException) -> str:
    """The text of ``exc`` and its causes, Java stack traces included (py4j's and pyspark's)."""
    texts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts.append(str(current))
        stack = getattr(current, "stackTrace", None)  # pyspark's CapturedException
        if isinstance(stack, str):
            texts.append(stack)
        current = current.__cause__ or current.__context__
    return "\n".join(texts)


def lake_failure(text: str, lake: JobLake) -> PostgresCdcError | None:
    """The package's error for the lake failure ``text`` (:func:`java_text`) shows, or None."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    catalog = [line for line in lines if _CATALOG.search(line)]
    if catalog:
        return _catalog_failure(lines, catalog, lake)
    for pattern, kind in ((_MISSING_BUCKET, "missing"), (_REFUSED, "refused")):
        matched = [line for line in lines if pattern.search(line) and _OBJECT_STORE.search(line)]
        if matched:
            return _storage_failure(kind, matched, text, lake)
    return None


def _catalog_failure(lines: list[str], catalog: list[str], lake: JobLake) -> CatalogError:
    where = f" at {lake.catalog_uri}" if lake.catalog_uri else ""
    if any("CommitStateUnknownException" in line for line in catalog):
        what = "did not say whether a commit went through (the next run reads each table's state)"
    elif any(re.search(r"NotAuthorizedException|ForbiddenException", line) for line in catalog):
        what = "refused the job's credentials midway"
    else:
        what = "stopped answering during the job"
    return CatalogError(
        f"Iceberg catalog {lake.catalog!r}{where} {what} ({_cause(lines)}): check that the catalog is up "
        "and reachable from the Spark driver, and the lake connection's URL and credentials. " + SLOT_STAYED
    )


def _storage_failure(kind: str, matched: list[str], text: str, lake: JobLake) -> PostgresCdcError:
    side, bucket = _side(matched, text, lake)
    shown = _line(matched[-1])
    if side == "staging":
        fix = (
            f"bucket {bucket!r} of the staged batch at {lake.staging} does not exist ({shown}): create "
            "it, or correct the manifest's location"
            if kind == "missing"
            else f"the object store refused the Spark job's credentials for bucket {bucket!r} of the "
            f"staged batch at {lake.staging} ({shown}): correct the staging connection "
            "(staging_conn_id: its access key id, secret and endpoint), or the cluster's own fs.s3a "
            "settings for that bucket"
        )
        return StagingAccessError(f"{fix}. {SLOT_STAYED}")
    warehouse = f" of the lake's warehouse {lake.warehouse}" if lake.warehouse else " of the lake"
    fix = (
        f"bucket {bucket!r}{warehouse} does not exist ({shown}): create it, or correct the lake "
        "connection's warehouse (and s3.endpoint)"
        if kind == "missing"
        else f"the object store refused the Spark job's credentials for bucket {bucket!r}{warehouse} "
        f"({shown}): correct s3.access-key-id and s3.secret-access-key in the lake connection's "
        "properties (or the credentials the catalog vends, or the cluster's own), and check that "
        "they may write the bucket"
    )
    return LakeStorageError(f"{fix}. {SLOT_STAYED}")


def _side(matched: list[str], text: str, lake: JobLake) -> tuple[str, str]:
    """("staging" or "lake", bucket) of a refused or missing bucket.

    The object the failure names decides: under the staged batch's directory it is staging's.
    Without one (the AWS SDK's own errors name none), the client does: Hadoop's ``s3a`` reads
    the staged files, Iceberg's ``S3FileIO`` writes the warehouse.
    """
    staging = _S3_URL.match(lake.staging)
    for line in matched:
        url = _S3_URL.search(line)
        if url is not None:
            under = staging is not None and _object(url).startswith(_object(staging))
            return ("staging" if under else "lake"), url[1]
    if staging is not None and "org.apache.hadoop.fs.s3a" in text and "org.apache.iceberg.aws" not in text:
        return "staging", staging[1]
    warehouse = _S3_URL.match(lake.warehouse)
    return "lake", warehouse[1] if warehouse else lake.warehouse


def _object(url: re.Match[str]) -> str:
    """``bucket/path`` of an ``s3://`` or ``s3a://`` URL (both name the same object)."""
    return f"{url[1]}{url[2] or ''}"


def root_cause(text: str) -> str:
    """A Java exception chain's root cause in one line: its last ``Caused by``, else its first line."""
    return _cause([line.strip() for line in text.splitlines() if line.strip()])


def _cause(lines: list[str]) -> str:
    """The chain's root cause (its last ``Caused by``), in one line."""
    causes = [line for line in lines if line.startswith("Caused by:")]
    return _line(causes[-1] if causes else lines[0] if lines else "")


def _line(line: str) -> str:
    """A Java exception's line without the trace's ``Caused by:`` or py4j's ``: `` before it."""
    return line.removeprefix("Caused by:").lstrip(": ").strip()[:300]
