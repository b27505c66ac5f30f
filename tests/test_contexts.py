"""Contexts (issue 42): ``ordq context list|use|show|add|remove`` and how every client command
finds the cluster the current context names (ordq/contexts.py). No cluster: a context naming a
port nobody listens on shows which address a command tried."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ordq import contexts
from ordq.cli import main
from ordq.common.errors import ConfigError
from ordq.zk_server import free_ports


@pytest.fixture(autouse=True)
def own_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A contexts file and a credentials file of this test's own; no cluster named by the environment."""
    monkeypatch.setenv("ORDQ_CREDENTIALS", str(tmp_path / "credentials.json"))
    monkeypatch.delenv("ORDQ_CONTEXTS", raising=False)
    for name in ("ORDQ_ZK", "ORDQ_ROOT", "ORDQ_BOOTSTRAP", "ORDQ_CONTEXT"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "contexts.json"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_add_use_show_list_remove(own_files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "context", "list") == (0, f"no contexts in {own_files} (ordq up adds one; ordq context add "
                                              "NAME --zk HOST:PORT adds one)\n", "")
    code, out, _ = run(capsys, "context", "add", "dev", "--zk", "127.0.0.1:2999", "--root", "/dev", "--use")
    assert (code, out) == (0, "context dev added (ZooKeeper 127.0.0.1:2999, root /dev); it is the current one\n")
    assert run(capsys, "context", "add", "prod", "--bootstrap", "10.0.0.1:7100", "--zk", "10.0.0.1:2181")[0] == 0
    code, out, _ = run(capsys, "context", "list")
    assert out.splitlines() == [
        "CURRENT  NAME  ZK              ROOT   BOOTSTRAP",
        "*        dev   127.0.0.1:2999  /dev   -",
        "         prod  10.0.0.1:2181   /ordq  10.0.0.1:7100",
    ]
    code, out, _ = run(capsys, "context", "list", "--json")
    assert json.loads(out) == {"current": "dev", "contexts": [
        {"name": "dev", "zk": "127.0.0.1:2999", "root": "/dev", "bootstrap": "-"},
        {"name": "prod", "zk": "10.0.0.1:2181", "root": "/ordq", "bootstrap": "10.0.0.1:7100"}]}
    assert run(capsys, "context", "show")[1] == "dev (current): ZooKeeper 127.0.0.1:2999, root /dev\n"
    assert run(capsys, "context", "use", "prod")[1] == (
        "current context: prod (ZooKeeper 10.0.0.1:2181, root /ordq; coordinators 10.0.0.1:7100)\n")
    assert json.loads(run(capsys, "context", "show", "--json")[1])["name"] == "prod"
    assert run(capsys, "context", "remove", "prod")[1] == "context prod removed; no context is current now\n"
    code, out, err = run(capsys, "context", "show")
    assert code == 1 and err.startswith("ordq: error: no current context")
    code, _, err = run(capsys, "context", "use", "nope")
    assert (code, err) == (1, "ordq: error: unknown context 'nope' (contexts: dev)\n")
    code, _, err = run(capsys, "context", "add", "bad name", "--zk", "h:1")
    assert code == 1 and "invalid context name 'bad name'" in err


def test_a_context_keeps_the_folder_of_the_cluster_ordq_up_made_it_for(own_files: Path) -> None:
    """``ordq up`` records its folder in the context (``ordq down`` elsewhere finds it); a
    context added by hand has none, and a file without the field reads as before."""
    contexts.add(contexts.Context(name="here", zk="127.0.0.1:2999", dir="/srv/ordq/c"), select=True)
    found = contexts.selected()
    assert found is not None and found.dir == "/srv/ordq/c"
    assert json.loads(own_files.read_text())["contexts"]["here"] == {"zk": "127.0.0.1:2999", "root": "/ordq",
                                                                     "dir": "/srv/ordq/c"}
    contexts.add(contexts.Context(name="plain", zk="h:1"))
    assert contexts.load().get("plain").dir is None
    assert contexts.load().get("here") != contexts.Context(name="here", zk="127.0.0.1:2999")


def test_a_command_without_zk_uses_the_current_context_and_flags_and_env_win(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42: after ``ordq up --zk-port 0``, ``ordq queue create`` tried 127.0.0.1:2181. A
    command names the cluster by its flags, else the environment, else --context/ORDQ_CONTEXT,
    else the current context; the error of a cluster that is not there names what was tried."""
    ctx_port, flag_port, env_port, other_port = free_ports(4)
    run(capsys, "context", "add", "here", "--zk", f"127.0.0.1:{ctx_port}", "--root", "/r1", "--use")
    run(capsys, "context", "add", "other", "--zk", f"127.0.0.1:{other_port}")

    def tried(*argv: str) -> str:
        code, _, err = run(capsys, "--zk-timeout", "0.3", *argv)
        assert code == 1, err
        return err

    assert f"127.0.0.1:{ctx_port}/r1" in tried("queue", "create", "q")  # nothing registered for it: named
    assert f"127.0.0.1:{ctx_port}" in tried("group", "list")  # the ZooKeeper it tried
    assert f"127.0.0.1:{flag_port}/ordq" in tried("--zk", f"127.0.0.1:{flag_port}", "queue", "list")
    assert f"127.0.0.1:{flag_port}/r1" in tried("queue", "list", "--zk", f"127.0.0.1:{flag_port}", "--root", "/r1")
    assert f"127.0.0.1:{other_port}/ordq" in tried("--context", "other", "queue", "list")
    monkeypatch.setenv("ORDQ_CONTEXT", "other")
    assert f"127.0.0.1:{other_port}/ordq" in tried("queue", "list")
    monkeypatch.delenv("ORDQ_CONTEXT")
    monkeypatch.setenv("ORDQ_ZK", f"127.0.0.1:{env_port}")
    assert f"127.0.0.1:{env_port}/ordq" in tried("queue", "list")
    monkeypatch.delenv("ORDQ_ZK")
    code, _, err = run(capsys, "--context", "nope", "queue", "list")
    assert code == 1 and "unknown context 'nope'" in err


names = st.text(alphabet="abcxyz019._-", min_size=1, max_size=8).filter(lambda n: n[0].isalnum())


@settings(deadline=None, max_examples=50)  # file writes under a lock: I/O, not a pure function
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "add-use", "use", "remove"]), names), max_size=12))
def test_the_file_keeps_what_the_operations_say(ops: list[tuple[str, str]], tmp_path_factory: pytest.TempPathFactory
                                                ) -> None:
    """A model of the file: the contexts added and not removed, the current one the last used
    or added with --use unless removed since."""
    path = tmp_path_factory.mktemp("ctx") / "contexts.json"
    model: dict[str, str] = {}
    current: str | None = None
    for op, name in ops:
        if op.startswith("add"):
            contexts.add(contexts.Context(name=name, zk=f"h:{len(name)}"), select=op == "add-use", path=path)
            model[name] = f"h:{len(name)}"
            current = name if op == "add-use" else current
        elif name not in model:
            with pytest.raises(ConfigError, match="unknown context"):
                (contexts.use if op == "use" else contexts.remove)(name, path=path)
        elif op == "use":
            contexts.use(name, path=path)
            current = name
        else:
            contexts.remove(name, path=path)
            del model[name]
            current = None if current == name else current
    found = contexts.load(path)
    assert {n: c.zk for n, c in found.contexts.items()} == model
    assert found.current == current
