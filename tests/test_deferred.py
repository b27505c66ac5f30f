"""The stand-ins of ordq/common/deferred.py (issue 42): a module deferred is imported on the first
attribute asked of it and answers as itself; what a short command never uses stays unimported.
Each case in an interpreter of its own (``sys.modules`` is the process's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ordq.zk_server import free_ports

REPO = Path(__file__).resolve().parent.parent


def run(code: str, env: dict[str, str] | None = None) -> str:
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_a_deferred_module_is_imported_on_first_use_and_answers_as_itself() -> None:
    out = run("""
import sys
from ordq.common.deferred import Deferred, defer, is_deferred
import json  # already imported: left as it is
assert defer(["colorsys", "json", "xml"]) == ["colorsys", "xml"]
import colorsys
assert is_deferred("colorsys") and isinstance(colorsys, Deferred)
assert colorsys.rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)   # imported now, answered by the real one
assert not is_deferred("colorsys") and sys.modules["colorsys"].__file__.endswith("colorsys.py")
assert colorsys.ONE_THIRD == sys.modules["colorsys"].ONE_THIRD
import xml.dom.minidom   # a submodule of a deferred package: its __path__ imports the package
assert not is_deferred("xml") and xml.dom.minidom.parseString("<a/>").documentElement.tagName == "a"
print("ok")
""")
    assert out.strip().endswith("ok"), out


def test_a_module_that_fails_to_import_stays_deferred_and_fails_again() -> None:
    out = run("""
from ordq.common.deferred import defer, is_deferred
defer(["no_such_module_anywhere"])
import no_such_module_anywhere as m
for _ in range(2):
    try:
        m.anything
    except ModuleNotFoundError:
        pass
    else:
        raise AssertionError("imported")
    assert is_deferred("no_such_module_anywhere")
print("ok")
""")
    assert out.strip().endswith("ok"), out


def test_an_admin_command_run_as_the_program_leaves_what_grpc_loads_and_never_uses_unimported(tmp_path: Path) -> None:
    """What the stand-ins are for: ``ordq queue list`` imports grpc and makes its call (here to
    an address nobody listens on) without ever importing asyncio, grpc.aio, inspect, socket (nor
    ssl, which asyncio loads); run as a library
    (``main(argv)``), the CLI defers nothing."""
    [closed] = free_ports(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORDQ_")}
    env.update(ORDQ_CREDENTIALS=str(tmp_path / "credentials.json"), PYTHONPATH=str(REPO))
    argv = ["--bootstrap", f"127.0.0.1:{closed}", "--zk-timeout", "0.3", "queue", "list"]
    program = f"""
import atexit, json, sys
def report():
    print(json.dumps({{m: type(sys.modules.get(m)).__name__
                      for m in ("grpc", "asyncio", "grpc.aio", "inspect", "socket", "ssl")}}))
atexit.register(report)
# The diagnosis after a failed call (ordq/bootstrap.py tls_mismatch: one TCP connection and one
# TLS handshake, issue 42) imports socket and ssl by design; what is pinned here is the call.
import ordq.bootstrap
ordq.bootstrap.tls_mismatch = lambda *args, **kwargs: None
from ordq.cli import main
sys.argv = ["ordq", *{argv!r}]
sys.exit(main())
"""
    res = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=REPO,
                         env=env)
    assert res.returncode == 1 and "no coordinator of the cluster answered" in res.stderr, res.stderr
    assert json.loads(res.stdout.splitlines()[-1]) == {"grpc": "module", "asyncio": "Deferred", "grpc.aio": "Deferred",
                                                        "inspect": "Deferred", "socket": "Deferred", "ssl": "NoneType"}
    library = run(f"import sys\nfrom ordq.cli import main\nmain({argv!r})\n"
                  "print(type(sys.modules.get('asyncio')).__name__)", env=env)
    assert library.strip().splitlines()[-1] == "module", library
