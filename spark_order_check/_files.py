"""Finding the audit files (driver side, metadata only: names, sizes, last bytes).

Rules: this module never reads a whole audit file into the driver, except that it counts the
newlines of a ``.tsv.part`` file whose last byte is not ``\\n`` (a writer crashed mid-line;
one such file per crashed process) to learn which row is torn.

Local paths (no URI scheme, or ``file:``) are listed with the standard library, so a missing
input is reported before Spark starts. Other schemes (``hdfs://``, ``s3a://``) are listed
through the Hadoop FileSystem of the running Spark session.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlparse

import attrs

from ordq.common.errors import ConfigError

KINDS = ("acks", "deliveries")
_NAME = re.compile(r"^(?P<writer>.+)-(?P<n>\d+)\.tsv(?P<part>\.part)?$")
# Row numbers live in the low 33 bits of a position (the layout of monotonically_increasing_id).
ROW_BITS = 33
MAX_FILES = 1 << 30


@attrs.frozen
class AuditFile:
    """One audit file. ``torn_row`` is the 0-based data row cut short by a crash, if any."""

    kind: str
    path: str  # as handed to Spark
    name: str
    writer: str
    n: int
    part: bool
    size: int
    torn_row: int | None = None


def is_remote(path: str) -> bool:
    scheme = urlparse(path).scheme
    return len(scheme) > 1 and scheme != "file"  # one letter: a Windows drive, not a scheme


def _local(path: str) -> str:
    return urlparse(path).path if path.startswith("file:") else path


def _accept(name: str) -> bool:
    return name.endswith(".tsv") or name.endswith(".tsv.part")


def _describe(name: str) -> tuple[str, int, bool]:
    m = _NAME.match(name)
    if m is None:
        return name, 0, name.endswith(".part")
    return m["writer"], int(m["n"]), m["part"] is not None


def _torn_row_local(path: str, size: int) -> int | None:
    """Index of the torn last data row of a ``.part`` file, or None when it ends in ``\\n``."""
    if size == 0:
        return None
    with open(path, "rb") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return None
        fh.seek(0)
        newlines = 0
        while chunk := fh.read(8 << 20):
            newlines += chunk.count(b"\n")
    # Line 0 is the header; complete data rows are 0 .. newlines-2; the torn one is next.
    return newlines - 1 if newlines >= 1 else None


def list_local(paths: Iterable[str], kind: str) -> list[AuditFile]:
    """Audit files of ``kind`` under local paths (a directory, a file or a glob pattern).

    Raises ConfigError naming the path when it does not exist or holds no ``*.tsv`` /
    ``*.tsv.part`` file.
    """
    found: dict[str, AuditFile] = {}
    for given in paths:
        p = _local(given)
        if any(ch in p for ch in "*?["):
            candidates = sorted(glob.glob(p))
            if not candidates:
                raise ConfigError(f"no {kind} audit files match {given}")
        elif os.path.isdir(p):
            candidates = [os.path.join(p, n) for n in sorted(os.listdir(p))]
        elif os.path.exists(p):
            candidates = [p]
        else:
            raise ConfigError(f"{kind} audit path does not exist: {given}")
        before = len(found)
        for c in candidates:
            name = os.path.basename(c)
            if not (_accept(name) and os.path.isfile(c)):
                continue
            full = os.path.abspath(c)
            writer, n, part = _describe(name)
            size = os.path.getsize(full)
            torn = _torn_row_local(full, size) if part else None
            found[full] = AuditFile(kind, full, name, writer, n, part, size, torn)
        if len(found) == before:
            raise ConfigError(f"no {kind} audit files (*.tsv, *.tsv.part) in {given}")
    return _check(list(found.values()), kind)


def list_remote(spark: Any, paths: Iterable[str], kind: str) -> list[AuditFile]:
    """Like :func:`list_local` for Hadoop file system URIs, through the session's JVM."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    found: dict[str, AuditFile] = {}
    for given in paths:
        hpath = jvm.org.apache.hadoop.fs.Path(given)
        fs = hpath.getFileSystem(conf)
        statuses = fs.globStatus(hpath)
        if statuses is None or len(statuses) == 0:
            raise ConfigError(f"{kind} audit path does not exist: {given}")
        before = len(found)
        for st in statuses:
            children = fs.listStatus(st.getPath()) if st.isDirectory() else [st]
            for child in children:
                name = child.getPath().getName()
                if not (child.isFile() and _accept(name)):
                    continue
                full = child.getPath().toString()
                writer, n, part = _describe(name)
                size = int(child.getLen())
                torn = _torn_row_remote(spark, full, fs, child.getPath(), size) if part else None
                found[full] = AuditFile(kind, full, name, writer, n, part, size, torn)
        if len(found) == before:
            raise ConfigError(f"no {kind} audit files (*.tsv, *.tsv.part) in {given}")
    return _check(list(found.values()), kind)


def _torn_row_remote(spark: Any, full: str, fs: Any, hpath: Any, size: int) -> int | None:
    if size == 0:
        return None
    stream = fs.open(hpath)
    try:
        stream.seek(size - 1)
        last = stream.read()
    finally:
        stream.close()
    if last == ord("\n"):
        return None
    lines = spark.sparkContext.textFile(full).count()  # the torn line counts as one
    return lines - 2 if lines >= 2 else None


def _check(files: list[AuditFile], kind: str) -> list[AuditFile]:
    by_name: dict[str, str] = {}
    for f in files:
        if f.name in by_name:
            # Rows are tied to their file by name inside Spark; writer ids are unique per
            # process, so a repeated name means the same run was given twice.
            raise ConfigError(f"two {kind} audit files share the name {f.name}: {by_name[f.name]} and {f.path}")
        by_name[f.name] = f.path
    if len(files) >= MAX_FILES:
        raise ConfigError(f"too many {kind} audit files ({len(files)})")
    # File ids follow (writer, n): positions of one writer's rows sort in the order written.
    return sorted(files, key=lambda f: (f.writer, f.n, f.name))


def partition_paths(paths: Sequence[str]) -> tuple[list[str], list[str]]:
    local = [p for p in paths if not is_remote(p)]
    remote = [p for p in paths if is_remote(p)]
    return local, remote
