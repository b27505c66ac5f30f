"""What a Spark job of the ordq streaming source carries to its executors, and what it says when
it fails (ordq/spark_source.py uses both).

- ``ship_credentials``: a cluster's client credentials (CA, client certificate and key, a file
  holding the token) added to the job (``SparkContext.addFile``), and the source options that
  name them; ``job_file`` finds this process's copy of one (``SparkFiles.get``) where the
  source's planner or a task runs.
- ``failure_reason``: the one line a failed query of the source ends with (the ordq error it
  raised, found in the traces Spark wraps it in).

Rules: nothing here is installed on a worker or read from a worker's own files: what a task
reads came with the job, or the task fails with a ConfigError naming the missing file.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

from pyspark.sql import SparkSession

from ordq.common.errors import ConfigError, OrdqError
from ordq.common.security import Credentials
from ordq.sdk._cluster import check_cluster, open_coordinator, resolve

# (Credentials field, source option, lower case) of the files credentialsFrom=job names.
FILE_OPTIONS = (("ca_file", "cafile"), ("cert_file", "certfile"), ("key_file", "keyfile"), ("token_file", "tokenfile"))

_SHIP_LOCK = threading.Lock()


def ship_credentials(spark: SparkSession, *, bootstrap: str | None = None, zk: str | None = None,
                     root: str = "/ordq", credentials: Credentials | None = None) -> dict[str, str]:
    """Send a cluster's client credentials to the executors with the job and return the source
    options that read them there: ``bootstrap``, ``credentialsFrom=job`` and the names of the
    shipped files (``caFile``, ``certFile``, ``keyFile``, ``tokenFile``).

    ``credentials`` default to those registered for the cluster (``bootstrap``, or ``zk`` and
    ``root`` as the SDK names it; ``$ORDQ_TOKEN`` wins for the token). The files go through
    ``SparkContext.addFile`` (as ``spark.files``/``--files``): Spark serves them from the
    driver to each executor's work folder; nothing is installed on a worker and nothing is
    read from a worker's own credentials file. The token goes as a file too (mode 0600 here),
    so it shows in no option, conf or plan. Each file is named after a digest of all four
    (``ordq-<digest>-ca.pem``...): two clusters' credentials in one session never collide.
    On a network others share, turn on ``spark.authenticate`` (the files are served to whoever
    connects to the driver as an executor).

    ConfigError when no cluster is named or registered, or a file cannot be read."""
    check_cluster(bootstrap, zk, root)
    addresses = resolve(bootstrap, zk, root)
    if credentials is None:
        _coord, credentials = open_coordinator(bootstrap, zk, root, None)
        _coord.close()
    contents: dict[str, bytes] = {}
    for field, option in FILE_OPTIONS[:3]:
        path = getattr(credentials, field)
        if path is not None:
            try:
                contents[option] = Path(path).read_bytes()
            except OSError as exc:
                raise ConfigError(f"cannot read {path} to ship it with the job: {exc.strerror}") from exc
    if credentials.token:
        contents["tokenfile"] = credentials.token.encode()
    digest = hashlib.sha256(b"\0".join(o.encode() + b"=" + c for o, c in sorted(contents.items()))).hexdigest()[:16]
    options = {"bootstrap": addresses, "root": root, "credentialsFrom": "job"}
    names = {"cafile": ("caFile", "ca.pem"), "certfile": ("certFile", "cert.pem"), "keyfile": ("keyFile", "key.pem"),
             "tokenfile": ("tokenFile", "token")}
    sc = spark.sparkContext
    with _SHIP_LOCK:
        shipped: set[str] = getattr(sc, "_ordq_shipped_files", set())
        for option, content in sorted(contents.items()):
            name = f"ordq-{digest}-{names[option][1]}"
            if name not in shipped:
                path = _ship_folder() / name
                if not path.exists():
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(content)
                sc.addFile(str(path))
                shipped.add(name)
            options[names[option][0]] = name
        sc._ordq_shipped_files = shipped  # type: ignore[attr-defined]
    return options


_FOLDER: list[Path] = []


def _ship_folder() -> Path:
    """This process's folder of files to ship (mode 0700, removed at exit): Spark refuses a
    file name added again from another path, so one folder for the process."""
    if not _FOLDER:
        folder = Path(tempfile.mkdtemp(prefix="ordq-ship-"))
        atexit.register(shutil.rmtree, folder, True)
        _FOLDER.append(folder)
    return _FOLDER[0]


def job_file(name: str | None) -> str | None:
    """This process's copy of a file shipped with the job (``SparkFiles.get``), None for None.
    ConfigError when the job did not bring it."""
    if name is None:
        return None
    if os.sep in name or name in ("", ".", ".."):
        raise ConfigError(f"{name!r} is not the name of a file shipped with the job (SparkFiles names have no "
                          "folder): ship it with SparkContext.addFile / spark.files, or use ship_credentials")
    from pyspark import SparkFiles

    try:
        path = SparkFiles.get(name)
    except Exception as exc:  # noqa: BLE001 - no Spark context in this process: not a Spark job
        raise ConfigError(f"the file {name} shipped with the job cannot be found outside a Spark job: {exc}") from exc
    if os.path.isfile(path):
        return path
    # Spark 4 runs a streaming source's planner on the driver with the files folder of the
    # query's own artifacts (``<root>/streaming_job``): the context's files are in the root.
    shared = os.path.join(os.path.dirname(os.path.dirname(path)), name)
    if os.path.isfile(shared):
        return shared
    raise ConfigError(f"the file {name} did not come with the job (not in {os.path.dirname(path)}): ship it "
                      "with SparkContext.addFile / spark.files, or use ordq.spark_source.ship_credentials")


def _error_names() -> list[str]:
    found, todo = set(), [OrdqError]
    while todo:
        cls = todo.pop()
        found.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return sorted(found, key=len, reverse=True)


def failure_reason(exc: BaseException) -> str:
    """The one line that says why a query of this source failed: the ordq error the source
    raised (``PermissionDenied: ...``, ``GapDetected: ...``), found in the Java and Python
    traces Spark wraps it in; else the failure's first line."""
    text = str(exc)
    names = "|".join(_error_names())
    found = re.search(rf"\b({names}): (.+)$", text, re.M)  # the first: the cause, above any re-raise
    if found:
        return f"{found.group(1)}: {found.group(2).strip()}"
    lines = text.strip().splitlines()
    return lines[0] if lines else type(exc).__name__
