"""The ``ordq`` CLI in-process: every --help works; bad input is one clear line on stderr
(``ordq: error: ...``) and a non-zero exit, never a traceback."""

from __future__ import annotations

import argparse

import pytest

from ordq.cli import build_parser, main
from ordq.zk_server import free_ports


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every (sub)command path, e.g. ("queue", "create")."""
    out = []
    for action in parser._actions:  # argparse has no public way to list subparsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append((*prefix, name))
                out.extend(command_paths(sub, (*prefix, name)))
    return out


@pytest.mark.parametrize("path", [(), *command_paths(build_parser())], ids=lambda p: " ".join(p) or "ordq")
def test_help_exits_0(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*path, "--help"])
    assert exit_.value.code == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"usage: ordq {' '.join(path)}".rstrip()) and err == ""


def test_commands_are_registered() -> None:
    assert {("zk", "start"), ("zk", "stop"), ("zk", "status"), ("queue", "create"), ("group", "add")} <= set(
        command_paths(build_parser())
    )


def one_error_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ordq: error: "), err
    return lines[0]


@pytest.mark.zk
def test_bad_input_is_one_clear_line(zk_server, zk_root, capsys: pytest.CaptureFixture[str]) -> None:
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
    line = one_error_line(capsys, "--zk", f"127.0.0.1:{closed}", "--zk-timeout", "0.5", "queue", "list")
    assert f"cannot reach ZooKeeper at 127.0.0.1:{closed}" in line


def test_zk_status_without_a_server_is_one_clear_line(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "no ZooKeeper set up" in one_error_line(capsys, "zk", "status", "--dir", str(tmp_path / "none"))


@pytest.mark.zk
def test_removing_an_unknown_group_is_an_error(zk_server, zk_root, capsys: pytest.CaptureFixture[str]) -> None:
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
