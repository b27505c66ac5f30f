"""Bad input, everywhere a user can type: every ``ordq`` subcommand, found by walking the
argument parser (a new command is covered without touching this file), gets missing,
malformed and hostile arguments; each must end with one clear error line on stderr and a
non-zero exit, never a traceback. The same for the SDK's configs: typed errors when built.

Runs in-process (``ordq.cli.main``) against one real ZooKeeper with a queue ``q`` (group
``g1`` registered, no broker processes: nothing here may get as far as storing anything).
Commands that start long-running processes (``up``, ``broker run``, ...) get only values their
parser must refuse before anything starts.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from ordq.cli import build_parser, main
from ordq.common.errors import ConfigError
from ordq.sdk import BatchingConfig, CommitConfig, ConsumerConfig, ProducerConfig
from tests.cluster import Cluster, module_cluster

# Options that make a command given good values return at once (a live view, a consumer).
BASELINE_OPTIONS = {("top",): ["--once"], ("consume",): ["--idle-exit", "0.2"], ("outbox", "relay"): ["--until-empty"],
                    ("cdc", "mysql"): ["--until-end"]}
HOSTILE_NAMES = ["", "a/b", "..", ".", "a\x00b", "ünïcode", "x" * 300, "-1", "9" * 40, " ", "q\n"]
HOSTILE_INTS = ["-1", "0", "9" * 40, "1.5", "abc", "", "nan"]
HOSTILE_FLOATS = ["-1", "nan", "inf", "1e999", "abc", ""]
NEVER_VALID = {"nan", "inf", "1e999", "abc", "1.5", "9" * 40}
BAD_ZK = ["", " ", "foo:bar:baz", "host:99999", ",", "h:1,,:"]
# Commands that start processes or long work: only refusals at parse time are tried.
STARTS_PROCESSES = {("up",), ("zk", "start"), ("broker", "run"), ("coordinator", "run"), ("demo",), ("drill",),
                    ("lab", "up")}
# Commands that only read local folders: ZooKeeper strings do not matter to them.
LOCAL_ONLY = {("down",), ("status",), ("zk", "stop"), ("zk", "status"), ("verify",), ("drill",), ("demo",),
              ("lab", "up"), ("lab", "down"), ("lab", "status"), ("lab", "exec")}


def leaf_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
                  ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from leaf_commands(sub, (*path, name))


COMMANDS = dict(leaf_commands(build_parser()))


def positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not a.option_strings]


def typed_options(parser: argparse.ArgumentParser, kind: str) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and getattr(a.type, "__name__", "") == kind
            and a.dest not in ("zk_timeout",)]


def valid_args(path: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    """Positionals (and required options) that parse: the baseline a case changes one thing of."""
    values = {"queue": "q", "gid": "g1", "subscription": "s", "queues": "q", "audit_dirs": "/nonexistent",
              "names": "kill-head-master"}
    out = [values.get(a.dest, "x") for a in positionals(parser)]
    out += BASELINE_OPTIONS.get(path, [])
    for a in parser._actions:
        if a.required and a.option_strings:
            out += [a.option_strings[0], {"--seq": "0", "--subscription": "s", "--to": "earliest",
                                          "--group": "g1", "--role": "master", "--data": "/nonexistent"}
                    .get(a.option_strings[0], "x")]
    return out


def cases() -> Iterator[tuple[str, list[str]]]:
    for path, parser in COMMANDS.items():
        base = valid_args(path, parser)
        name = " ".join(path)
        for a in typed_options(parser, "int") + typed_options(parser, "float"):
            values = HOSTILE_INTS if a in typed_options(parser, "int") else HOSTILE_FLOATS
            if path in STARTS_PROCESSES:  # only what must be refused before anything starts
                values = [v for v in values if v in NEVER_VALID or (v == "-1" and a.dest != "seed")]
                if a.dest == "seed":
                    values = [v for v in values if v != "9" * 40]
            for v in values:
                yield f"{name} {a.option_strings[0]}={v!r}", [*path, *base, a.option_strings[0], v]
        if path in STARTS_PROCESSES:
            continue
        for i, a in enumerate(positionals(parser)):
            if a.dest in ("audit_dirs", "names"):
                continue
            for v in HOSTILE_NAMES:
                args = list(base)
                args[i] = v
                yield f"{name} {a.dest}={v!r}", [*path, *args]
        if path not in LOCAL_ONLY:
            for z in BAD_ZK:
                yield f"{name} --zk={z!r}", ["--zk", z, *path, *base]
        if any(a.required for a in parser._actions) or any(a.nargs not in ("*", "?") for a in positionals(parser)):
            yield f"{name} (nothing)", [*path, *BASELINE_OPTIONS.get(path, [])]


CASES = dict(cases())


@pytest.fixture(scope="module")
def cluster(zk_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One live group g1 and a queue q, so that a command given good values finishes fast."""
    with module_cluster(zk_server, tmp_path_factory, "bad-input", "g1") as c:
        c.create_queue("q")
        yield c


def run(argv: list[str], cluster: Cluster, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))  # `produce` reads stdin
    monkeypatch.chdir(cluster.base)  # a command that creates a file by name (`outbox init -1`) makes it there
    full = ["--zk", cluster.hosts, "--root", cluster.root, "--zk-timeout", "2", *argv]
    try:
        code = main(full)
    except SystemExit as exc:  # argparse: usage error (2) or --help (0)
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.zk
@pytest.mark.parametrize("argv", list(CASES.values()), ids=list(CASES))
def test_bad_input_is_one_clear_error(argv: list[str], cluster: Cluster, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run(argv, cluster, capsys, monkeypatch)
    assert "Traceback" not in err + out, err
    if code == 0:
        # Accepted: only input that means something (a group named "-1", a seed of -1, port 0
        # for "any free port"); a number that is not one, or absurdly large, never is.
        option = argv[-2] if len(argv) >= 2 and argv[-2].startswith("--") else None
        assert option is None or option == "--seed" or argv[-1] not in NEVER_VALID, (argv, out)
        return
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, f"exit {code} with nothing on stderr"
    assert lines[-1].startswith("ordq") and ": error: " in lines[-1], err
    assert len(lines[-1]) < 400, lines[-1]


def test_every_command_gets_bad_input() -> None:
    """Guards the generator: a command it cannot find anything to try on is a gap to fill
    (a table entry here), not a silent pass."""
    names = {" ".join(p) for p in COMMANDS}
    tried = {name for name in names if any(case.startswith(name + " ") for case in CASES)}
    untried = names - tried - {"down", "status", "zk stop", "zk status", "lab down", "lab status"}  # --dir only
    assert not untried, f"commands with no bad-input case: {sorted(untried)}"


@pytest.mark.parametrize("options", [
    {"bootstrap": ""}, {"bootstrap": "a:b:c"}, {"bootstrap": None}, {"queue": ""}, {"queue": "a/b"},
    {"queue": "x" * 200},
    {"root": "no-slash"}, {"send_timeout_s": 0}, {"no_group_timeout_s": -1}, {"lease_ttl_s": 0},
])
def test_producer_config_refuses_bad_values(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ProducerConfig(**{"bootstrap": "127.0.0.1:7301", "queue": "q", **options})


@pytest.mark.parametrize("options", [
    {"bootstrap": ""}, {"bootstrap": "host:99999"}, {"bootstrap": "127.0.0.1:7301,"}, {"queue": ".."},
    {"subscription": ""},
    {"subscription": "a\x00b"}, {"start": "yesterday"}, {"fetch_max_bytes": 0}, {"fetch_wait_ms": -1},
    {"coordinator_outage_s": -1}, {"lease_ttl_s": 0}, {"leader_timeout_s": -5},
])
def test_consumer_config_refuses_bad_values(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ConsumerConfig(**{"bootstrap": "127.0.0.1:7301", "queue": "q", "subscription": "s", **options})


@pytest.mark.parametrize("build", [
    lambda: BatchingConfig(linger_ms=-1), lambda: BatchingConfig(max_batch_messages=0),
    lambda: BatchingConfig(max_batch_bytes=0), lambda: BatchingConfig(max_inflight_bytes=1, max_batch_bytes=2),
    lambda: CommitConfig(every_messages=0), lambda: CommitConfig(every_ms=0),
])
def test_option_groups_refuse_bad_values(build: Any) -> None:
    with pytest.raises(ConfigError):
        build()


def test_unknown_options_are_refused() -> None:
    with pytest.raises(TypeError):
        ProducerConfig(zk_hosts="127.0.0.1:2181", queue="q", lingr_ms=5)  # type: ignore[call-arg]
