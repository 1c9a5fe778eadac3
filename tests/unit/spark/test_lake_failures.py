"""Which Java failures of the lake a Spark job reports as the package's errors (spark/lake_failures.py).

The traces are the jobs' own, caught against SeaweedFS (S3 and its Iceberg REST catalog) and cut
to their telling lines; tests/integration/reliability/test_bad_inputs.py causes them for real.
"""

from __future__ import annotations

from airflow_provider_postgres_cdc.errors import CatalogError, LakeStorageError, StagingAccessError
from airflow_provider_postgres_cdc.spark.lake_failures import JobLake, java_text, lake_failure

LAKE = JobLake(
    catalog="lake",
    catalog_uri="http://127.0.0.1:8181",
    warehouse="s3://nobucket/lake",
    staging="s3://staging/cdc/slot1/snapshot-0000000010000000",
)

MISSING_WAREHOUSE_BUCKET = """\
An error occurred while calling o41.sql.
: software.amazon.awssdk.services.s3.model.NoSuchBucketException: The specified bucket does not exist \
(Service: S3, Status Code: 404, Request ID: 18EC57E40CFA414B14350AD2) (SDK Attempt Count: 1)
\tat software.amazon.awssdk.services.s3.model.NoSuchBucketException$BuilderImpl.build(NoSuchBucketExc\
eption.java:150)
\tat org.apache.iceberg.aws.s3.S3OutputStream.completeUploads(S3OutputStream.java:440)
"""
REFUSED_WAREHOUSE_KEYS = """\
An error occurred while calling o105.append.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed 1 times, \
most recent failure: Lost task 0.0 in stage 0.0 (TID 0) (192.0.2.2 executor driver): \
java.io.UncheckedIOException: Failed to close current writer
\tat org.apache.iceberg.io.RollingFileWriter.closeCurrentWriter(RollingFileWriter.java:128)
Caused by: java.io.IOException: software.amazon.awssdk.services.s3.model.S3Exception: The request signature \
we calculated does not match the signature you provided. Check your key and signing method. (Service: S3, \
Status Code: 403, Request ID: 18EC57E56123D139850E159C) (SDK Attempt Count: 1)
\tat org.apache.iceberg.aws.s3.S3OutputStream.close(S3OutputStream.java:280)
"""
REFUSED_STAGING_KEYS = """\
An error occurred while calling o300.exists.
: java.nio.file.AccessDeniedException: s3://staging/cdc/slot1/snapshot-0000000010000000/_manifest.json: \
getFileStatus on s3://staging/cdc/slot1/snapshot-0000000010000000/_manifest.json: \
com.amazonaws.services.s3.model.AmazonS3Exception: Forbidden (Service: Amazon S3; Status Code: 403; \
Error Code: 403 Forbidden; Request ID: 18EC57E843B3897B69F26D84; S3 Extended Request ID: null; Proxy: null)
\tat org.apache.hadoop.fs.s3a.S3AUtils.translateException(S3AUtils.java:255)
Caused by: com.amazonaws.services.s3.model.AmazonS3Exception: Forbidden (Service: Amazon S3; \
Status Code: 403; Error Code: 403 Forbidden; Request ID: 18EC57E843B3897B69F26D84; S3 Extended Request ID: \
null; Proxy: null)
"""
CATALOG_GONE = """\
An error occurred while calling o276.create.
: org.apache.iceberg.exceptions.RESTException: Error occurred while processing POST request
\tat org.apache.iceberg.rest.HTTPClient.execute(HTTPClient.java:359)
\tat org.apache.iceberg.rest.RESTTableOperations.commit(RESTTableOperations.java:159)
Caused by: org.apache.iceberg.shaded.org.apache.hc.core5.http.NoHttpResponseException: 127.0.0.1:40319 \
failed to respond
"""


def test_a_missing_warehouse_bucket_is_the_lake_s_named_by_the_warehouse() -> None:
    error = lake_failure(MISSING_WAREHOUSE_BUCKET, LAKE)
    assert isinstance(error, LakeStorageError)
    message = str(error)
    assert message.startswith("bucket 'nobucket' of the lake's warehouse s3://nobucket/lake does not exist (")
    assert "(software.amazon.awssdk.services.s3.model.NoSuchBucketException: The specified bucket" in message
    assert "correct the lake connection's warehouse" in message and "the slot did not move" in message


def test_keys_the_store_refuses_to_iceberg_s_client_are_the_lake_s() -> None:
    error = lake_failure(REFUSED_WAREHOUSE_KEYS, JobLake("lake", warehouse="s3://warehouse/"))
    assert isinstance(error, LakeStorageError)
    assert "refused the Spark job's credentials for bucket 'warehouse'" in str(error)
    assert "Status Code: 403" in str(error) and "s3.secret-access-key" in str(error)


def test_keys_refused_on_the_staged_batch_are_staging_s() -> None:
    error = lake_failure(REFUSED_STAGING_KEYS, LAKE)
    assert isinstance(error, StagingAccessError)
    assert "bucket 'staging' of the staged batch at s3://staging/cdc/" in str(error)
    assert "staging_conn_id" in str(error) and "the slot did not move" in str(error)


def test_a_refused_object_outside_the_batch_is_the_lake_s() -> None:
    elsewhere = REFUSED_STAGING_KEYS.replace(
        "s3://staging/cdc/slot1/snapshot-0000000010000000", "s3a://lake/t"
    )
    error = lake_failure(elsewhere, LAKE)
    assert isinstance(error, LakeStorageError) and "bucket 'lake'" in str(error)


def test_a_catalog_that_vanished_mid_job_is_named_with_its_root_cause() -> None:
    error = lake_failure(CATALOG_GONE, LAKE)
    assert isinstance(error, CatalogError)
    assert str(error).startswith(
        "Iceberg catalog 'lake' at http://127.0.0.1:8181 stopped answering during the job "
        "(org.apache.iceberg.shaded.org.apache.hc.core5.http.NoHttpResponseException: 127.0.0.1:40319"
    )
    unknown = CATALOG_GONE.replace("RESTException", "CommitStateUnknownException")
    assert "did not say whether a commit went through" in str(lake_failure(unknown, LAKE))


def test_other_failures_stay_unexpected() -> None:
    assert lake_failure("java.lang.NullPointerException\n\tat org.apache.iceberg.X.y(X.java:1)", LAKE) is None
    assert lake_failure("Access Denied for user 'x'@'db'", LAKE) is None  # no object store in sight


def test_the_text_holds_every_cause_of_the_python_chain() -> None:
    try:
        try:
            raise KeyError("inner")
        except KeyError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as exc:
        assert java_text(exc) == "outer\n'inner'"
