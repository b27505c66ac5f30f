"""The ``ordq`` CLI in-process: every --help works; bad input is one clear line on stderr
(``ordq: error: ...``) and a non-zero exit, never a traceback."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

import pytest

from ordq.cli import COMMANDS, build_parser, command_module, main
from ordq.common.security import register_coordinators, unregister
from ordq.zk_server import free_ports
from tests.cluster import (
    cluster_fixture,  # noqa: F401 - provides the ``cluster`` fixture
    start_coordinator,
)


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every (sub)command path, e.g. ("queue", "create")."""
    out = []
    for action in parser._actions:  # argparse has no public way to list subparsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append((*prefix, name))
                out.extend(command_paths(sub, (*prefix, name)))
    return out


def _last_line_of(code: str) -> str:
    """What a fresh interpreter running ``code`` printed last (it must exit 0)."""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()[-1]


@pytest.mark.parametrize("path", [(), *command_paths(build_parser())], ids=lambda p: " ".join(p) or "ordq")
def test_help_exits_0(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*path, "--help"])
    assert exit_.value.code == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: ordq {' '.join(path)}".rstrip()) and err == ""


def test_each_module_registers_the_commands_the_cli_imports_it_for() -> None:
    """main() imports only the named command's module (COMMANDS): a name registered by another
    module than the one COMMANDS says would not be found."""
    for module, commands in COMMANDS.items():
        parser = build_parser(module)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        assert tuple(sub.choices) == commands, module
    full = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert tuple(full.choices) == tuple(c for cs in COMMANDS.values() for c in cs)


@pytest.mark.parametrize(("argv", "module"), [
    (["queue", "list"], "queue"), (["--zk", "queue", "--root", "/r", "produce", "q"], "clients"),
    (["-v", "--json", "up"], "cluster"), (["--zk-timeout", "3", "topic", "list"], "topic"),
    (["--help", "queue"], None), (["--version"], None), (["qeueu", "list"], None), ([], None),
])
def test_the_command_is_found_past_the_global_options(argv: list[str], module: str | None) -> None:
    assert command_module(argv) == module


def test_a_command_imports_neither_kazoo_nor_grpc_until_it_needs_them() -> None:
    """Every ``ordq`` process paid ~0.6 s of CPU importing every command's modules (grpc,
    kazoo, the broker) before it did anything; a doc test runs hundreds of commands."""
    code = ("import sys; from ordq.cli import main\n"
            "try:\n    main(['queue', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('grpc', 'kazoo', 'pyspark') if m in sys.modules))")
    assert _last_line_of(code) == "[]"


def test_commands_are_registered() -> None:
    assert {("zk", "start"), ("zk", "stop"), ("zk", "status"), ("queue", "create"), ("group", "add")} <= set(
        command_paths(build_parser())
    )


@pytest.fixture
def coordinator(zk_server, zk_root, tmp_path) -> Iterator[str]:
    """A coordinator on the test's root, registered for it: the admin CLI asks its admin API
    (issue 37). Its address."""
    [port] = free_ports(1)
    address = f"127.0.0.1:{port}"
    proc = start_coordinator("coordinator-0", zk_server.connection_string, zk_root, tmp_path / "run", listen=address)
    register_coordinators(zk_server.connection_string, zk_root, [address])
    try:
        yield address
    finally:
        unregister(zk_server.connection_string, zk_root)
        proc.kill()


def one_error_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ordq: error: "), err
    return lines[0]


@pytest.mark.zk
def test_bad_input_is_one_clear_line(zk_server, zk_root, coordinator, capsys: pytest.CaptureFixture[str]) -> None:
    zk = ("--zk", zk_server.connection_string, "--root", zk_root)
    assert "unknown queue 'nope'" in one_error_line(capsys, *zk, "queue", "describe", "nope")
    assert "invalid queue name 'bad/name'" in one_error_line(capsys, *zk, "queue", "create", "bad/name")
    assert "invalid group name" in one_error_line(capsys, *zk, "group", "add", "x" * 129)
    assert "unknown broker group 'g9'" in one_error_line(capsys, *zk, "queue", "create", "q", "--groups", "g9")
    assert main([*zk, "group", "add", "g1"]) == 0
    assert "already exists" in one_error_line(capsys, *zk, "group", "add", "g1")
    # the same options after the command name mean the same
    assert "unknown queue 'nope'" in one_error_line(capsys, "queue", "describe", "nope", *zk, "--json")


def test_unreachable_zookeeper_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    [closed] = free_ports(1)  # nobody listens there
    line = one_error_line(capsys, "--zk", f"127.0.0.1:{closed}", "--zk-timeout", "0.5", "group", "list")
    assert f"cannot reach ZooKeeper at 127.0.0.1:{closed}" in line


def test_an_admin_verb_without_a_coordinator_is_one_clear_line(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The admin CLI speaks to the coordinators (issue 37): none registered, or none answering
    at the registered addresses, is one line naming them, exit 1, within --zk-timeout."""
    import time

    monkeypatch.setenv("ORDQ_CREDENTIALS", str(tmp_path / "credentials.json"))
    [closed, dead] = free_ports(2)
    line = one_error_line(capsys, "--zk", f"127.0.0.1:{closed}", "--zk-timeout", "0.5", "queue", "list")
    assert "no coordinators are registered" in line and "ordq up" in line
    register_coordinators(f"127.0.0.1:{closed}", "/ordq", [f"127.0.0.1:{dead}"])
    began = time.monotonic()
    line = one_error_line(capsys, "--zk", f"127.0.0.1:{closed}", "--zk-timeout", "0.5", "queue", "list")
    assert f"answered at 127.0.0.1:{dead}" in line and "is the cluster running" in line
    assert time.monotonic() - began < 5


def test_zk_status_without_a_server_is_one_clear_line(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "no ZooKeeper set up" in one_error_line(capsys, "zk", "status", "--dir", str(tmp_path / "none"))


# ``ordq coordinator run`` with its daemon's first round held back 3 s: whatever READY promises
# must not rest on that round
_LATE_DAEMON = ("-c", "import sys, time\n"
                "import ordq.commands.coordinator as c\n"
                "run = c._run_then_wake\n"
                "c._run_then_wake = lambda daemon, stop: (time.sleep(3), run(daemon, stop))\n"
                "from ordq.cli import main\n"
                "sys.exit(main(sys.argv[1:]))\n")


@pytest.mark.zk
def test_a_new_clusters_first_coordinator_has_made_its_root_when_it_says_ready(zk_server, zk_root, tmp_path,
                                                                                capsys) -> None:
    """A command run as soon as a new cluster's first coordinator said READY found no cluster
    ("no ordq cluster under --root", this file's unknown-group test, once in the default tier):
    the root was the daemon's first round's, which runs just after READY. Held back here, so
    the command below runs before it, every time."""
    proc = start_coordinator("coordinator-0", zk_server.connection_string, zk_root, tmp_path / "run",
                             program=_LATE_DAEMON)
    try:
        zk = ("--zk", zk_server.connection_string, "--root", zk_root)
        assert "unknown broker group 'g9'" in one_error_line(capsys, *zk, "group", "remove", "g9")
    finally:
        proc.kill()


@pytest.mark.zk
def test_removing_an_unknown_group_is_an_error(zk_server, zk_root, coordinator,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    zk = ("--zk", zk_server.connection_string, "--root", zk_root)
    assert "unknown broker group 'g9'" in one_error_line(capsys, *zk, "group", "remove", "g9")
    assert "unknown queue 'q9'" in one_error_line(capsys, *zk, "queue", "delete", "q9")


def test_a_local_zookeeper_starts_where_zk_points() -> None:
    # `ordq up` / `ordq zk start` default to the port ORDQ_ZK (--zk) names on this machine,
    # so the commands after them reach it without more settings; elsewhere: the default.
    from ordq.commands import local_zk_port

    assert local_zk_port("127.0.0.1:2999", 2181) == 2999
    assert local_zk_port("localhost:2999", 2181) == 2999
    for other in ("zk1.example:2181", "127.0.0.1:2999,127.0.0.1:3000", "127.0.0.1", "127.0.0.1:x"):
        assert local_zk_port(other, 2181) == 2181


# -- issue 24: fail fast, say why --------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ("queue", "lisst"),  # an unknown action
    ("queue", "create"),  # a missing argument
    ("--zk-timeout", "soon", "queue", "list"),  # a bad global value
    ("produce", "q", "--count", "0"),  # a value out of range
    ("nosuchcommand",),
], ids=" ".join)
def test_usage_errors_are_one_line_and_exit_1(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    # docs/CLI.md: a failure is one line on stderr and exit code 1 (argparse: a usage block, 2)
    line = one_error_line(capsys, *argv)
    assert main(list(argv)) == 1
    assert "--help" in line


def test_secrets_come_from_files(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from ordq.cli import _secret

    token = tmp_path / "token"
    token.write_text("ordq_0123abcd_secret\n")
    assert _secret(None, token, "--token-file") == "ordq_0123abcd_secret"
    assert _secret("given", None, "--token-file") == "given"
    (tmp_path / "empty").write_text("\n")
    assert "is empty" in one_error_line(capsys, "--token-file", str(tmp_path / "empty"), "queue", "list")
    assert "cannot read --zk-auth-file" in one_error_line(
        capsys, "queue", "list", "--zk-auth-file", str(tmp_path / "missing"))
    assert "not both" in one_error_line(capsys, "--token", "x", "--token-file", str(token), "queue", "list")


def test_verify_without_pyspark_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pyspark", None)  # as if the spark extra were not installed
    assert main(["verify", "/nonexistent"]) == 2  # verify's "could not verify"
    _, err = capsys.readouterr()
    assert err.strip().splitlines() == [
        "ordq verify: error: ordq verify needs PySpark and Java 17+: pip install 'ordq[spark]' (docs/VERIFIER.md)"]


CLIENT_VERBS = [("produce", "q", "--count", "1"), ("consume", "q", "-s", "s1", "--count", "1"),
                ("produce", "--topic", "t", "--key", "k"), ("consume", "--topic", "t", "--group", "g")]


@pytest.mark.parametrize("verb", CLIENT_VERBS, ids=" ".join)
def test_a_client_command_without_coordinators_says_to_pass_bootstrap(verb: tuple[str, ...],
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Guard: a client command finds its cluster by the coordinators' addresses only (issue 37):
    with none registered for --zk/--root and no --bootstrap it says what to pass, at once,
    without trying ZooKeeper."""
    import time

    [closed] = free_ports(1)  # nobody listens there, and nothing is registered for it
    began = time.monotonic()
    line = one_error_line(capsys, "--zk", f"127.0.0.1:{closed}", "--root", "/nowhere", *verb)
    assert time.monotonic() - began < 2.0
    assert "no coordinators are registered" in line and "--bootstrap HOST:PORT" in line, line


@pytest.mark.parametrize("verb", CLIENT_VERBS, ids=" ".join)
def test_a_client_command_given_a_bootstrap_nobody_listens_on_fails_in_one_line(
        verb: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    """Guard: ``--bootstrap`` naming an address where no coordinator listens is one line naming
    it, a non-zero exit and no traceback, within --zk-timeout (+ slack for a loaded box)."""
    import time

    [closed] = free_ports(1)
    began = time.monotonic()
    line = one_error_line(capsys, "--bootstrap", f"127.0.0.1:{closed}", "--zk-timeout", "0.5", *verb)
    assert time.monotonic() - began < 0.5 + 2.0 + 2.0  # --zk-timeout, one ask of each address, a loaded box
    assert f"no coordinator of the cluster answered at 127.0.0.1:{closed} (given)" in line, line


def test_a_client_command_given_a_bad_bootstrap_or_env_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """--bootstrap after the command name, and ORDQ_BOOTSTRAP, mean the same as before it."""
    line = one_error_line(capsys, "produce", "q", "--count", "1", "--bootstrap", "nohost")
    assert "bad coordinator address 'nohost'" in line
    [closed] = free_ports(1)
    monkeypatch.setenv("ORDQ_BOOTSTRAP", f"127.0.0.1:{closed}")
    line = one_error_line(capsys, "--zk-timeout", "0.5", "consume", "q", "-s", "s1")
    assert f"answered at 127.0.0.1:{closed}" in line, line


def test_the_client_commands_import_no_zookeeper_client() -> None:
    """Guard: the client commands hold no ZooKeeper session (issue 37): their modules, and the
    CLI up to the point where the SDK starts, import no kazoo."""
    code = ("import sys\nfrom ordq.cli import main\n"
            "import ordq.commands.clients, ordq.commands.topic_group, ordq.commands.cdc, ordq.commands.outbox\n"
            "import ordq.bootstrap\n"
            "main(['--bootstrap', '127.0.0.1:1', '--zk-timeout', '0.2', 'produce', 'q', '--count', '1'])\n"
            "print(sorted(m for m in sys.modules if m.startswith('kazoo'))[:3])\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "[]", res.stdout + res.stderr


@pytest.mark.zk
def test_auth_revoke_never_echoes_a_token_and_create_refuses_unknown_queues(
        cluster, capsys: pytest.CaptureFixture[str]) -> None:
    zk = ("--zk", cluster.hosts, "--root", cluster.root)
    # and a coordinator with the cluster's certificates: a plaintext one takes no tokens
    # (tests/test_claim_fence_bound.py)
    cluster.add_groups("g1")
    secret = "S3cr3tS3cr3tS3cr3tS3cr3tS3cr3tS3cr3tS3cr3tA"
    line = one_error_line(capsys, *zk, "auth", "revoke", f"ordq_0123abcd_{secret}")
    assert "no token 0123abcd" in line and secret not in line  # the id inside a whole token
    line = one_error_line(capsys, *zk, "auth", "revoke", f"{secret}")
    assert "not a token id" in line and secret not in line
    line = one_error_line(capsys, *zk, "auth", "create", "--role", "consume:nosuchqueue")
    assert "no queue nosuchqueue" in line and "--allow-unknown-queue" in line
    assert main([*zk, "auth", "create", "--role", "consume:nosuchqueue", "--allow-unknown-queue"]) == 0


@pytest.mark.zk
def test_a_bad_or_revoked_token_is_refused_at_once(cluster, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """The client commands are refused by the coordinator they ask (its Describe), the admin
    ones where they read."""
    import json
    import time

    zk = ("--zk", cluster.hosts, "--root", cluster.root)
    cluster.add_groups("g1")  # and a coordinator, registered for (hosts, root)
    assert main([*zk, "queue", "create", "q"]) == 0
    capsys.readouterr()
    assert main([*zk, "--json", "auth", "create", "--role", "admin"]) == 0  # tokens enforced from here
    admin = tmp_path / "admin.token"
    admin.write_text(json.loads(capsys.readouterr().out)["token"])
    as_admin = (*zk, "--token-file", str(admin))
    assert main([*as_admin, "auth", "create", "--role", "consume:q", "--name", "reader"]) == 0
    reader = capsys.readouterr().out.splitlines()[0]
    assert main([*as_admin, "queue", "list"]) == 0
    capsys.readouterr()
    assert main([*as_admin, "auth", "revoke", reader]) == 0
    capsys.readouterr()
    cases = {
        "garbage": ("--token", "garbage"),
        "revoked": ("--token", reader),
        "none": (),
    }
    for why, token in cases.items():
        for verb in (("queue", "list"), ("queue", "describe", "q"), ("produce", "q", "--count", "1"),
                     ("consume", "q", "-s", "s1", "--count", "1")):
            began = time.monotonic()
            line = one_error_line(capsys, *zk, *token, *verb)
            assert "permission denied" in line, (why, verb, line)
            assert time.monotonic() - began < 5, (why, verb)
    # nothing was created on the way: no subscription
    assert cluster.store.list_subscriptions("q") == []


def test_options_of_a_command_are_not_taken_for_abbreviated_global_ones(capsys: pytest.CaptureFixture[str]) -> None:
    # `--to` (sub reset) is a prefix of the global --token and --token-file
    [closed] = free_ports(1)
    line = one_error_line(capsys, "--zk", f"127.0.0.1:{closed}", "--zk-timeout", "0.2", "sub", "reset", "q", "s",
                          "--to", "seq", "1")
    assert "no coordinators are registered" in line


def test_listings_page_by_name_with_prefix_limit_and_after(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 29: ``queue list``, ``sub list`` and ``top`` show a page; stderr names the next."""
    from ordq.commands.paging import page, say_next

    args = build_parser().parse_args(["queue", "list", "--prefix", "o", "--limit", "2"])
    names = ["scratch", "orders-3", "orders-1", "other", "orders-2"]
    first = page(names, args)
    assert first.names == ["orders-1", "orders-2"] and first.next_after == "orders-2"
    say_next(first, "queues")
    assert capsys.readouterr().err == "ordq: 2 queues shown, more follow: add --after orders-2\n"
    args = build_parser().parse_args(["queue", "list", "--prefix", "o", "--limit", "2", "--after", "orders-2"])
    last = page(names, args)
    assert last.names == ["orders-3", "other"] and last.next_after is None
    say_next(last, "queues")
    assert capsys.readouterr().err == ""
    for argv in (["sub", "list", "q", "--limit", "5"], ["top", "--prefix", "x", "--once"]):
        assert build_parser().parse_args(argv).limit in (5, 100)
    assert "must be from 1" in one_error_line(capsys, "queue", "list", "--limit", "0")


def test_the_top_level_help_imports_no_command_module() -> None:
    """Issue 42: ``ordq --help`` took 0.35 s on a quiet box (3-4 s at load 14): building the
    parser imported every command's module, grpc, asyncio and the cluster health code among
    them. ``import ordq.cli``, ``--help``, ``--version`` and a mistyped command import none, nor
    protobuf, cryptography, logging, typing or ordq's errors (0.1 s of CPU is the target)."""
    code = ("import sys\nfrom ordq.cli import build_parser, main\n"
            "build_parser(stubs=True)\n"
            "for argv in (['--help'], ['--version'], ['qeueu', 'list'], []):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'asyncio', 'kazoo', 'attrs', 'attr',\n"
            "             'google', 'cryptography', 'logging', 'typing')\n"
            "             or m.startswith(('ordq.commands', 'ordq.common.errors', 'ordq.cluster_health',\n"
            "                              'ordq.coordinator'))))")
    assert _last_line_of(code) == "[]"


def test_the_top_level_help_lines_are_the_commands_own() -> None:
    """``COMMAND_HELP`` (what ``ordq --help`` shows without importing the commands) says what
    each module registers, in the same order."""
    from ordq.cli import COMMAND_HELP

    full = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {a.dest: a.help for a in full._choices_actions} == COMMAND_HELP
    stubs = next(a for a in build_parser(stubs=True)._actions if isinstance(a, argparse._SubParsersAction))
    assert [a.dest for a in stubs._choices_actions] == [a.dest for a in full._choices_actions]


def test_a_wait_says_what_it_waits_for_after_a_second(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42: a command that waited (for ZooKeeper, the coordinators, its election) said
    nothing; now one line once the wait is longer than SAY_AFTER_S, on a terminal or with
    ORDQ_PROGRESS=1, and none for a short wait or in a script."""
    import threading

    from ordq.commands import saying
    from tests.util import wait_until

    monkeypatch.setenv("ORDQ_PROGRESS", "1")
    with saying("waiting to be elected the producer of q", after_s=0.05):
        seen = wait_until(lambda: capsys.readouterr().err or None, timeout_s=10, what="the waiting line")
    assert seen == "ordq: waiting to be elected the producer of q ...\n"
    with saying("quick", after_s=5.0):
        pass
    monkeypatch.delenv("ORDQ_PROGRESS")
    with saying("in a script", after_s=0.0):  # not a terminal: no line, even at once
        pass
    for thread in [t for t in threading.enumerate() if t.name == "ordq-saying"]:
        thread.join(timeout=10)  # whatever a thread was to print is printed
    assert capsys.readouterr().err == ""


def test_drill_list_fits_100_columns(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 42: ``ordq drill list`` was one table row per drill, 400 columns wide."""
    from ordq.drills.catalog import CENTRES, DRILLS, ON_SPARK_CLUSTER
    from ordq.drills.partitions import PARTITIONS

    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal still gets 100 at most
    capsys.readouterr()
    assert main(["drill", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    named = {line.split()[0] for line in lines[1:] if not line.startswith(" ")}
    assert named == {*DRILLS, *PARTITIONS, *CENTRES, *ON_SPARK_CLUSTER}


def test_testing_knobs_are_hidden_from_help_and_still_parse(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42: help lists what an operator uses; ``drill --test-hook`` (the drills' own test,
    docs/OPERATIONS.md) is hidden, and still taken."""
    with pytest.raises(SystemExit):
        main(["drill", "--help"])
    assert "--test-hook" not in capsys.readouterr().out
    args = build_parser("drill").parse_args(["drill", "kill-head-master", "--test-hook", "lose"])
    assert args.test_hook == "lose"


def test_help_leaves_out_the_zookeeper_credential_where_no_session_is_held(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42: help lists only the flags a command uses. ``queue list`` and ``produce`` ask the
    coordinator and hold no ZooKeeper session: no --zk-auth in their help (still taken: scripts
    pass it); ``group list`` and ``status`` (its own sweep when no coordinator answers) keep it."""
    for argv, shown in ((["queue", "list"], False), (["produce"], False), (["topic", "list"], False),
                        (["group", "list"], True), (["status"], True), (["topic", "group"], True)):
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        assert ("--zk-auth" in capsys.readouterr().out) is shown, argv
    args = build_parser("queue").parse_args(["queue", "list", "--zk-auth", "u:p", "--zk-auth-file", "f"])
    assert args.zk_auth == "u:p" and str(args.zk_auth_file) == "f"


CLUSTER_FLAGS = ("--bootstrap", "--zk ", "--root", "--zk-auth")


@pytest.mark.parametrize("argv", [("cert", "ca"), ("cert", "issue"), ("context", "list"), ("context", "use"),
                                  ("context", "show"), ("context", "remove"), ("lab", "status"), ("lab", "up"),
                                  ("demo",), ("drill",)], ids=" ".join)
def test_a_command_that_reaches_no_cluster_shows_none_of_its_flags(argv: tuple[str, ...],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42: help lists only the flags a command uses. These reach no cluster (a CA, a
    certificate, the contexts file, a lab; the demo and the drills start their own): no
    --bootstrap, --zk, --root or --zk-auth in their help; still taken, as before them."""
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    shown = capsys.readouterr().out
    assert not [f for f in CLUSTER_FLAGS if f in shown], shown
    args = build_parser("context").parse_args(["context", "list", "--zk", "h:1", "--root", "/r", "--bootstrap", "b:2"])
    assert (args.zk, args.root, args.bootstrap) == ("h:1", "/r", "b:2")


def test_a_command_that_reaches_a_cluster_shows_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["context", "add"], ["cert", "register"], ["up"], ["queue", "list"], ["verify"]):
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        shown = capsys.readouterr().out
        assert "--zk " in shown and "--root" in shown, argv


def test_the_consumer_group_summary_is_a_table() -> None:
    """Issue 42: ``consume --topic T --group G`` ended with ``(partitions {'1': 1})``."""
    import io

    from ordq.commands.topic_group import print_partitions

    out = io.StringIO()
    print_partitions({"10": 3, "2": 1}, out=out)
    assert out.getvalue().splitlines() == ["PARTITION  DELIVERED", "2          1", "10         3"]


def test_an_admin_command_imports_only_what_it_uses() -> None:
    """Issue 42: ``ordq queue list`` took 0.53 s of CPU (target 0.25). An admin command talks to
    the coordinator over gRPC and nothing else: no ZooKeeper client, no protobuf (its two messages
    are written by ordq/wire/admin_messages.py), no server-side admin table, no Spark or pandas.
    Run against a closed port: the imports are those of a call up to its first RPC."""
    [closed] = free_ports(1)
    code = ("import sys\nfrom ordq.cli import main\n"
            f"main(['--bootstrap', '127.0.0.1:{closed}', '--zk-timeout', '0.3', 'queue', 'list'])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kazoo', 'google', 'cryptography', 'pandas',\n"
            "             'pyspark') or m in ('ordq.coordinator.admin_api', 'ordq.wire.ordq_pb2', 'ordq.sdk')))\n"
            "print('grpc' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "no coordinator of the cluster answered" in res.stderr, res.stderr
    assert res.stdout.splitlines()[-2:] == ["[]", "True"], res.stdout + res.stderr


def test_sigint_while_the_commands_are_half_imported_is_an_interrupt() -> None:
    """CI: ``ordq top`` started in the background took SIGINT while ``ordq.commands`` was being
    imported, and its handler's own import of that package failed with ImportError (exit 1 and a
    traceback) instead of stopping the command. The handler imports nothing now."""
    code = ("import signal, sys, types\n"
            "from ordq import cli\n"
            "sys.modules['ordq.commands'] = types.ModuleType('ordq.commands')  # half imported\n"
            "try:\n    cli._on_sigint(signal.SIGINT, None)\n"
            "except KeyboardInterrupt:\n    print('interrupted', cli.INTERRUPTED.is_set())\n")
    assert _last_line_of(code) == "interrupted True"


def test_sigint_while_the_cli_takes_sigint_is_an_interrupt() -> None:
    """Loaded tier (stop 88): ``ordq top`` started in the background, signalled as soon as its
    SIGINT handler was in place, took the signal while ``signal.signal`` was still returning (in
    its Python wrapper): the KeyboardInterrupt came before main's own ``try``, a traceback and
    death by SIGINT instead of "interrupted" and 130. The signal is delivered here at that very
    point (the real handler, called as the interpreter calls it), no timing involved."""
    code = ("import signal\n"
            # Python's own handler to start from, whatever this child inherited: once (make test,
            # stop 95) it was started with SIGINT ignored, put that back, and printed "130 True False".
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from ordq import cli\n"
            "real = signal.signal\n"
            "def landing(signum, handler):\n"
            "    previous = real(signum, handler)\n"
            "    if handler is cli._on_sigint:\n"
            "        handler(signum, None)  # the SIGINT that came before this call returned\n"
            "    return previous\n"
            "signal.signal = landing\n"
            "code = cli.main(['queue', 'list'])\n"
            "signal.signal = real\n"
            "print(code, cli.INTERRUPTED.is_set(), signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == "130 True True"  # interrupted; the handler before it put back
    assert res.stderr.strip() == "ordq: interrupted"


def test_coordinator_run_help_names_the_spread_bound_the_daemon_takes(capsys: pytest.CaptureFixture[str]) -> None:
    """`coordinator run --help` says the spread's default bound as a number (the command module does
    not import the daemon to build its parser): the daemon's own constant."""
    from ordq.coordinator.daemon_spread import REBALANCE_MOVES_PER_S

    with pytest.raises(SystemExit):
        main(["coordinator", "run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert f"default {REBALANCE_MOVES_PER_S:g})" in out
