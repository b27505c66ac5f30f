"""The wheel installs one package, ``ordq``, and works outside the checkout: built with
``python -m build`` from the checkout's files, installed into a fresh venv in a temporary
folder, and used there as a user would — ``ordq up``, a produce, a consume, ``ordq verify``,
``ordq down`` — with no PYTHONPATH and the checkout out of reach.

The venv gets ordq from the wheel alone (``--no-deps``); its third-party dependencies are the
test venv's, reached through a path line in a ``.pth`` file: Python adds that folder to
``sys.path`` after the venv's own, without running the ``.pth`` files in it, so the checkout's
editable install stays out and downloading pyspark again is not needed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.zk, pytest.mark.spark]
REPO = Path(__file__).resolve().parent.parent


def checkout_copy(dest: Path) -> Path:
    """The files a clean clone would have (tracked or new, not ignored), links kept as links."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    for rel in listed:
        src, dst = REPO / rel, dest / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree, not yet committed
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, dst)
    return dest


def build_wheel(tmp: Path) -> Path:
    src = checkout_copy(tmp / "src")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp / "dist"),
                    str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp / "dist").glob("ordq-*.whl")
    return wheel


def fresh_venv(tmp: Path, wheel: Path) -> Path:
    venv = tmp / "venv"
    # Without pip of its own (installing pip into it was 16 s of the test): the test venv's pip
    # installs the wheel into it (``--python``).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, timeout=300, capture_output=True)
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "ordq-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_the_wheel_holds_only_ordq_and_runs_a_cluster_outside_the_checkout(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"  # ordq-<version>.dist-info
    assert {name.split("/")[0] for name in names} == {"ordq", dist_info}, names[:20]
    assert "ordq/sdk/consumer.py" in names  # a linked folder's files, in the wheel as real files

    venv = fresh_venv(tmp_path, wheel)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ORDQ_ZK", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"

    def run(*argv: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(list(argv), cwd=work, env=env, capture_output=True, text=True, timeout=timeout_s)
        assert res.returncode == 0, f"{argv}: {res.stdout}\n{res.stderr}"
        return res

    where = run("python", "-c", "import ordq, ordq.sdk; print(ordq.__file__); print(ordq.sdk.__file__)").stdout
    assert all(line.startswith(str(venv)) for line in where.split()), where
    probe = subprocess.run(["python", "-c", "import sdk"], cwd=work, env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'sdk'" in probe.stderr

    run("ordq", "up", "--zk-port", "0", "--groups", "1", "--coordinators", "1")
    try:
        env["ORDQ_ZK"] = json.loads(run("ordq", "status", "--json").stdout)["zk"]
        run("ordq", "queue", "create", "wheel")
        run("ordq", "produce", "wheel", "--count", "300", "--audit-dir", "run")
        consumed = run("ordq", "consume", "wheel", "-s", "w", "--count", "300", "--json", "--audit-dir", "run")
        assert json.loads(consumed.stdout)["last_seq"] == 299
        verdict = run("ordq", "verify", "run", timeout_s=600)
        assert "ordq verify: PASS" in verdict.stdout
    finally:
        run("ordq", "down", "--wipe")
    assert not (work / ".ordq").exists()
