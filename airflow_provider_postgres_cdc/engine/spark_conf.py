"""Spark settings that hold secrets reach spark-submit in a private properties file, never as ``--conf``.

A ``--conf key=value`` argument is on the spark-submit command line, which any user of the worker
reads in ``ps`` or ``/proc/<pid>/cmdline``, and which the Spark provider logs (masking only keys
named like ``password`` or ``secret``). Catalog passwords, REST tokens and OAuth2 client
credentials, and S3 secret keys therefore go into a ``--properties-file`` written with mode 0600
in a private directory that the caller deletes once the job has ended. Spark reads that file
before it starts the driver, so the job sees the same configuration as with ``--conf``.

``--properties-file`` replaces the distribution's ``conf/spark-defaults.conf``: the file written
here starts with the defaults (or with the file the user named), and the settings given here
follow, so later keys win as they would on the command line.

Standard library only: the Airflow side calls it when it submits a job.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

# A setting whose last part names a secret (``...jdbc.password``, ``...token``, ``...credential``,
# ``...s3.secret-access-key``, ``...s3.session-token``, ``spark.hadoop.fs.s3a.secret.key``).
_SECRET_PART = re.compile(r"(password|secret|token|credential)", re.IGNORECASE)
# Spark's UI and event log redact values whose keys match this (Spark's default plus ``credential``).
REDACTION_REGEX = r"(?i)secret|password|token|access[.]key|credential"
PROPERTIES_NAME = "postgres-cdc-secrets.conf"
# The jobs' drivers log at WARN unless the user set a level (``with_defaults``): Spark's
# INFO is thousands of lines per job, each read and logged by the Spark provider's hook. The jobs' own
# lines (what each table took, the cut) are Python logging, which this leaves alone.
DRIVER_LOG_CONF = {"spark.log.level": "WARN"}
# A short job's driver JVM compiles with C1 only: it ends before the optimizing compiler pays off
# (measured in docs/LAKE.md, "What a table costs").
SHORT_JIT_OPTIONS = "-XX:TieredStopAtLevel=1"
SHORT_DRIVER_CONF = {"spark.driver.extraJavaOptions": SHORT_JIT_OPTIONS}
_PROPERTY_KEY = re.compile(r"^((?:[^\\\s=:]|\\.)+)")


def is_secret_key(key: str) -> bool:
    """Whether a Spark setting holds a secret, by its last two dotted parts (``fs.s3a.secret.key``)."""
    return any(_SECRET_PART.search(part) for part in key.split(".")[-2:])


def split_secrets(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """``conf`` as (settings that may be on a command line, settings that hold secrets)."""
    public: dict[str, str] = {}
    secret: dict[str, str] = {}
    for key, value in conf.items():
        (secret if is_secret_key(key) else public)[key] = str(value)
    return public, secret


def submit_settings(
    conf: Mapping[str, str], directory: str, properties_file: str | None = None
) -> tuple[dict[str, str], str | None]:
    """The ``conf`` and ``properties_file`` to hand spark-submit for ``conf``: its secrets in a file in
    ``directory`` (after ``properties_file``'s, or the Spark defaults'), the rest as ``--conf``."""
    public, secret = split_secrets(conf)
    if not secret:
        return public, properties_file
    # The redaction rule goes with the secrets (on a command line, the Spark provider's own log
    # masking mangles it); a --conf the caller gave still wins.
    secret = {"spark.redaction.regex": REDACTION_REGEX, **secret}
    return public, write_properties_file(directory, secret, properties_file or spark_defaults_file())


def with_defaults(
    conf: Mapping[str, str],
    defaults: Mapping[str, str],
    properties_file: str | None,
    environ: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """``conf`` with each of ``defaults`` added, unless the user already set that key.

    A key set in ``conf``, in the ``properties_file`` the job is submitted with, or in the
    ``spark-defaults.conf`` spark-submit reads otherwise is the user's and stays: given as
    ``--conf``, the default would override the files.
    """
    source = properties_file or spark_defaults_file(environ)
    in_file = property_keys(source) if source and os.path.isfile(source) else set()
    added = {key: value for key, value in defaults.items() if key not in conf and key not in in_file}
    return {**added, **conf}


def property_keys(path: str | os.PathLike[str]) -> set[str]:
    """The keys a java.util.Properties file sets (comments and blank lines skipped; escapes kept)."""
    keys = set()
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        text = line.lstrip()
        if text and text[0] not in "#!" and (match := _PROPERTY_KEY.match(text)):
            keys.add(match.group(1))
    return keys


def spark_defaults_file(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The ``spark-defaults.conf`` spark-submit reads: ``$SPARK_CONF_DIR``'s, else ``$SPARK_HOME/conf``'s."""
    for directory in (environ.get("SPARK_CONF_DIR"), os.path.join(environ.get("SPARK_HOME", ""), "conf")):
        if directory and os.path.isfile(os.path.join(directory, "spark-defaults.conf")):
            return Path(directory, "spark-defaults.conf")
    return None


def write_properties_file(
    directory: str, settings: Mapping[str, str], base: str | os.PathLike[str] | None
) -> str:
    """Write ``base``'s lines, then ``settings``, to a mode-0600 file in ``directory``; return its path."""
    path = os.path.join(directory, PROPERTIES_NAME)
    head = Path(base).read_text(encoding="utf-8") if base else ""
    lines = [f"{_escape(key, is_key=True)}={_escape(value)}" for key, value in settings.items()]
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(head if not head or head.endswith("\n") else head + "\n")
        out.write("\n".join(lines) + "\n")
    return path


def _escape(text: str, *, is_key: bool = False) -> str:
    """``text`` as java.util.Properties reads it back (Spark loads the file as UTF-8)."""
    out = []
    for index, char in enumerate(text):
        if char == "\\":
            out.append("\\\\")
        elif char in "\n\r\t\f":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f"}[char])
        elif (char in "=: " and is_key) or (char in "#!" and index == 0) or (char == " " and index == 0):
            out.append("\\" + char)
        else:
            out.append(char)
    return "".join(out)
