"""Docs are tests: every command README.md, docs/CLI.md and docs/SDK.md show runs here.

Each doc that opted in (``<!-- doc-test -->``; see ``tests/helpers/doc_blocks.py`` for the
whole convention, and docs/CONTRIBUTING.md) runs as one scenario: its fenced blocks in
document order, in a fresh folder, in one bash session and one Python process, against the
real cluster the doc starts itself (``ordq up``, on a free ZooKeeper port through
``ORDQ_ZK``); what a ``$`` command prints must match the lines the doc shows after it, and
every command must exit as the doc says. A doc that drifts from the code fails here, naming
the doc's file and line with a diff. Whatever the doc left running is stopped and wiped
afterwards (kept, for its logs, when the doc failed).

The first tests check the harness itself, without I/O: the parser, the matcher, and that a
drifted doc is reported as such.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ordq.common.proc import OWNER_ENV, owner_token, sweep_orphans
from ordq.drills import audit
from tests.helpers.doc_blocks import (
    DocFormatError,
    Expected,
    Step,
    check,
    doc_files,
    line_matches,
    match_lines,
    parse_doc,
)
from tests.helpers.doc_session import EVERY_HOST, DocSession, StepRun, run_doc, step_timeout_s

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = ("README.md", "docs/CLI.md", "docs/SDK.md")


# -- the harness, without I/O -----------------------------------------------------------------


def test_a_line_matches_with_ellipsis_and_any_whitespace() -> None:
    assert line_matches("g1     127.0.0.1:...  yes", "g1  127.0.0.1:40595    yes   ")
    assert line_matches("acked 5 of 5 in ...s (... msgs/s, 1 failovers)",
                        "acked 5 of 5 in 1.20s (4.1 msgs/s, 1 failovers)")
    assert line_matches("...", "anything at all")
    assert not line_matches("acked 5 of 5", "acked 5 of 6")
    assert not line_matches("a b", "ab")
    assert not line_matches("seg 1", "seg 10")  # a line matches whole, not a prefix


def test_an_ellipsis_line_matches_any_number_of_lines() -> None:
    assert match_lines(["first", "...", "last"], ["first", "last"]) is None
    assert match_lines(["first", "...", "last"], ["first", "x", "y", "last"]) is None
    assert match_lines(["...", "PASS", "..."], ["spark noise", "PASS", "table"]) is None
    assert match_lines([], []) is None
    assert match_lines([], ["unexpected"]) == 0  # a command shown with no output prints nothing
    assert match_lines(["a", "b"], ["a", "c"]) == 1  # index of the first line no alignment passes
    assert match_lines(["a"], ["a", "more"]) == 1  # more printed than shown


_lines = st.lists(st.text(alphabet="ab :.\t-", max_size=12).filter(lambda t: "..." not in t), max_size=12)


@given(_lines, st.data())
def test_output_with_parts_written_as_ellipsis_still_matches(actual: list[str], data: st.DataObject) -> None:
    # what a doc writer does to real output: cut runs of lines to one `...` line, parts of a
    # line to `...`, and re-space; the result must still match that output
    expected: list[str] = []
    i = 0
    while i < len(actual):
        how = data.draw(st.sampled_from(["keep", "cut-lines", "cut-part", "respace"]))
        if how == "cut-lines":
            expected.append("...")
            i += data.draw(st.integers(0, len(actual) - i))
            continue
        line = actual[i]
        if how == "cut-part" and line:
            a = data.draw(st.integers(0, len(line)))
            b = data.draw(st.integers(a, len(line)))
            line = line[:a] + "..." + line[b:]
        elif how == "respace":
            line = " ".join(line.split(" ")) if "  " not in line else line.replace("  ", "\t")
        expected.append(line)
        i += 1
    assert match_lines(expected, actual) is None, (expected, actual)


DRIFTED = """\
# A doc
<!-- doc-test -->

```
$ ordq queue create orders
queue orders created on groups g1, g2, g3; send head: g1
$ ordq status
...
[exit 3]
```
"""


def test_a_drifted_doc_fails_naming_its_file_and_line_with_a_diff() -> None:
    [block] = parse_doc("docs/X.md", DRIFTED)
    create, status = block.steps
    assert create == Step("check", "ordq queue create orders", 5,
                          Expected(("queue orders created on groups g1, g2, g3; send head: g1",), 0, 6))
    assert status.expected is not None and status.expected.exit_code == 3
    # the code now says something else: the doc's line 6 is named, with a diff
    bad = check("docs/X.md", create, "queue orders created on groups g1, g2; send head: g1\n", 0)
    assert bad is not None
    text = bad.render()
    assert text.startswith("docs/X.md:5: output differs from the doc from its line 6")
    assert "-queue orders created on groups g1, g2, g3; send head: g1" in text
    assert "+queue orders created on groups g1, g2; send head: g1" in text
    # right output, wrong exit code; and a command that never finished
    bad = check("docs/X.md", status, "all healthy\n", 0)
    assert bad is not None and "exited 0, the doc says 3" in bad.render()
    bad = check("docs/X.md", create, "", None)
    assert bad is not None and "did not finish in time" in bad.render()
    assert check("docs/X.md", create, "queue orders created on groups g1, g2, g3; send head: g1\n", 0) is None


def test_block_kinds_skips_and_python_output() -> None:
    doc = """\
```bash
ordq up   # a comment is not output
# a comment line

ordq produce q \\
  --count 5
```

<!-- doc-test: skip this is what CI runs -->
```bash
make test
```

```
ordq [--zk HOST:PORT] COMMAND     (a synopsis: not run)
```

```python
print(1 + 1)
```

```output
2
```
"""
    plain, skipped, synopsis, python = parse_doc("d.md", doc)
    assert [s.source for s in plain.steps] == ["ordq up   # a comment is not output", "ordq produce q \\\n  --count 5"]
    assert all(s.kind == "run" and s.expected is None for s in plain.steps)
    assert skipped.skip_reason == "this is what CI runs" and not skipped.runs
    assert not synopsis.runs
    [step] = python.steps
    assert step.kind == "python" and step.line == 19 and step.expected == Expected(("2",), 0, 23)
    with pytest.raises(DocFormatError, match="needs a reason"):
        parse_doc("d.md", "<!-- doc-test: skip -->\n```bash\nls\n```\n")
    with pytest.raises(DocFormatError, match="never closed"):
        parse_doc("d.md", "```bash\nls\n")


def test_a_here_document_runs_as_one_step() -> None:
    doc = (
        "```bash\n"
        "cat > a.toml <<EOF\n"
        'host = "$HOST1"\n'
        "# a line of the file, not a comment\n"
        "EOF\n"
        "cat > b.toml <<'END'\n"
        "x = 1\n"
        "END\n"
        "echo done\n"
        "```\n"
    )
    [block] = parse_doc("d.md", doc)
    assert block.host is None
    assert [(s.source, s.line) for s in block.steps] == [
        ('cat > a.toml <<EOF\nhost = "$HOST1"\n# a line of the file, not a comment\nEOF', 2),
        ("cat > b.toml <<'END'\nx = 1\nEND", 6), ("echo done", 9)]


SESSION_DOC = """\
```console
$ export GREETING=hello; sleep 0.2 && echo "$GREETING from the background" &
$ echo "zk at $ORDQ_ZK"; ls .venv/bin/ordq
zk at 127.0.0.1:2181
.venv/bin/ordq
$ wait
hello from the background
```

```python
import os
zk = os.environ["ORDQ_ZK"]
print(zk, "127.0.0.1:2181" == zk)
```

```output
127.0.0.1:2181 True
```

```python
print(zk.count(":"))   # a later block sees what an earlier one defined
raise SystemExit(3)
```

```output
1
[exit 3]
```

```console
$ echo drifted
what the doc says
```
"""


def test_a_session_runs_steps_in_one_shell_and_one_python_and_reports_drift(tmp_path: Path) -> None:
    with DocSession(tmp_path / "run", doc="docs/S.md") as session:
        runs = list(run_doc(session, SESSION_DOC))
    # export, & and wait carry across commands; 127.0.0.1:2181 stands for the session's
    # ZooKeeper (replaced in code, shown as such in output); python blocks share globals
    assert [r.mismatch for r in runs[:-1]] == [None] * 5, [r.mismatch.render() for r in runs if r.mismatch]
    assert runs[1].output.startswith("zk at 127.0.0.1:2181\n") and session.zk != "127.0.0.1:2181"
    drift = runs[-1].mismatch
    assert drift is not None
    assert drift.render().splitlines()[:2] == ["docs/S.md:31: output differs from the doc from its line 32",
                                               "  $ echo drifted"]


DETACHED = ("from pathlib import Path; from ordq.common.proc import ManagedProcess; "
            "p = ManagedProcess('server', ['sh', '-c', 'sleep 600', str(Path('run').absolute())], "
            "run_dir=Path('run')); p.start(); p.detach(); "
            "print(p.pid)")


def test_what_a_doc_leaves_running_is_this_runs_and_no_other_suites_sweep_takes_it(tmp_path: Path) -> None:
    """Issue 26: two suites on one machine. A doc's ``ordq up`` exits and leaves its servers
    running (here: a detached process naming the doc's folder, as brokers do); they must carry
    this run as owner (as the tests' own processes do), or the other suite's sweep at its
    start kills them in the middle of the doc. Its credentials go to a file of its own, not
    the user's."""
    with DocSession(tmp_path / "run", doc="docs/S.md") as session:
        [started] = run_doc(session, f"```console\n$ python -c \"{DETACHED}\"\n...\n```\n")
        server = int(started.output.split()[-1])
        try:
            assert server not in sweep_orphans([tmp_path])  # what another suite's sweep does
            assert Path(f"/proc/{server}").exists()
            assert session.env[OWNER_ENV] == owner_token()
            assert Path(session.env["ORDQ_CREDENTIALS"]).is_relative_to(tmp_path)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server, signal.SIGKILL)  # its own group: sh and its sleep


def test_the_required_docs_opt_in() -> None:
    for rel in REQUIRED:
        text = (ROOT / rel).read_text()
        assert "<!-- doc-test -->" in text.splitlines(), f"{rel} must hold the line <!-- doc-test -->"
        assert any(b.runs for b in parse_doc(rel, text)), f"{rel} runs nothing"


# -- the docs, on real clusters ---------------------------------------------------------------


def _param(rel: str) -> object:
    text = (ROOT / rel).read_text()
    commands = " ".join(s.source for b in parse_doc(rel, text) if b.runs for s in b.steps)
    marks = [pytest.mark.zk]
    if any(word in commands for word in ("ordq verify", "ordq drill", "ordq demo")):
        marks.append(pytest.mark.spark)
    return pytest.param(rel, marks=marks, id=rel)


@pytest.mark.parametrize("rel", [_param(rel) for rel in doc_files(ROOT, REQUIRED)])
def test_doc_runs_as_written(rel: str, tmp_path: Path) -> None:
    runs = []
    with DocSession(tmp_path / "run", doc=rel) as session:
        for run in run_doc(session, (ROOT / rel).read_text()):
            runs.append(run)
            if run.mismatch is not None:
                pytest.fail(f"{run.mismatch.render()}\n(files, logs of the cluster: {session.folder})", pytrace=False)
    slowest = ", ".join(f"{rel}:{r.step.line} {r.seconds:.1f}s" for r in sorted(runs, key=lambda r: -r.seconds)[:5])
    print(f"{rel}: {len(runs)} steps in {sum(r.seconds for r in runs):.1f}s; slowest: {slowest}")


@pytest.mark.slow
@pytest.mark.zk
@pytest.mark.spark
def test_make_demo_passes(tmp_path: Path) -> None:
    """README's `make demo` (not run from the README: minutes) installs what is missing, which
    `make test` did already, then runs `ordq demo`: run that, smaller."""
    assert "\t$(VENV)/bin/ordq demo\n" in (ROOT / "Makefile").read_text()
    ordq = Path(sys.executable).parent / "ordq"
    proc = subprocess.run([str(ordq), "demo", "--dir", str(tmp_path / "demo"), "--messages", "8000"],
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout


THREE_MACHINES = "## Deploying on three machines"


def doc_section(rel: str, heading: str) -> str:
    """The text of one section of a doc (to its next heading of the same level), the lines
    before it blanked so that the doc's line numbers stay right in reports."""
    lines = (ROOT / rel).read_text().splitlines()
    start = lines.index(heading)
    level = heading.split(" ", 1)[0] + " "
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(level)), len(lines))
    return "\n" * start + "\n".join(lines[start:end]) + "\n"


MACHINES = ("host1", "host2", "host3")
CLIENT_MESSAGES = 500
FOLDER_RE = re.compile(r"\bhost\d/")


@functools.cache
def _no_lab() -> str | None:
    """Why the lab cannot run here, or None (asked once: it tries a throwaway namespace)."""
    from ordq.lab.lab import unavailable

    return unavailable()


def deploy_on_three_machines(folder: Path, addresses: dict[str, str], wraps: dict[str, list[str]]) -> None:
    """Run docs/OPERATIONS.md's "Deploying on three machines" with one session per machine
    (its own shell, environment and credentials file; ``wraps``: the argv prefix that puts
    each of ``host1``-``host3`` and ``client`` where it runs), each block on the machine it
    names, ``$HOST1``-``$HOST3`` set to ``addresses``' (the doc's own line setting them is
    skipped). Then, from the client machine, what an application's machine does: register
    the client certificate host1 issued (copied), produce to the doc's queue, and consume the
    whole queue from its start through a new subscription: every message, in order, once."""
    text = doc_section("docs/OPERATIONS.md", THREE_MACHINES)
    blocks = [b for b in parse_doc("docs/OPERATIONS.md", text) if b.runs]
    assert {b.host for b in blocks} == {*MACHINES, EVERY_HOST}, [b.host for b in blocks]  # what runs where
    # host1 prepares every machine's folder; the others read only their own (the lab's hosts
    # share one file system: this is what says a command would find its files on a machine)
    strays = {f"{b.path}:{b.line} (on {b.host})": found for b in blocks if b.host in MACHINES[1:]
              if (found := set(FOLDER_RE.findall("\n".join(b.body))) - {f"{b.host}/"})}
    assert not strays, f"a machine reading another machine's folder: {strays}"
    exports = "export " + " ".join(f"HOST{k}={addresses[h]}" for k, h in enumerate(MACHINES, 1))
    with contextlib.ExitStack() as stack:
        sessions = {h: stack.enter_context(DocSession(folder, doc="docs/OPERATIONS.md", wrap=wraps[h],
                                                      home=folder.parent / f"{h}-home"))
                    for h in (*MACHINES, "client")}
        for session in sessions.values():
            out, code = session.run(Step("run", exports, 0), timeout_s=10)
            assert code == 0, out
        runs = []
        for run in run_doc({h: sessions[h] for h in MACHINES}, text):
            runs.append(run)
            if run.mismatch is not None:
                pytest.fail(f"on {run.host}: {run.mismatch.render()}\n(files, logs: {folder})", pytrace=False)
        assert len(runs) > 20
        audit_dir = folder / "client" / "audit"
        for command in ("export ORDQ_ZK=$HOST1:2181,$HOST2:2181,$HOST3:2181",
                        "mkdir client && cp host1/ca.pem host1/client.pem host1/client-key.pem client/",
                        # the coordinators' addresses come with the certificate: clients hold no ZooKeeper session
                        "ordq --bootstrap $HOST1:7100 cert register --cert client/client.pem "
                        "--key client/client-key.pem --ca client/ca.pem --zk-tls",
                        f"ordq produce orders --count {CLIENT_MESSAGES} --audit-dir {audit_dir}",
                        f"ordq consume orders -s client --count {1000 + CLIENT_MESSAGES} --quiet "
                        f"--audit-dir {audit_dir}"):
            started = time.monotonic()
            out, code = sessions["client"].run(Step("run", command, 0), timeout_s=step_timeout_s())
            runs.append(StepRun(Step("run", command, 0), out, code, time.monotonic() - started, None, "client"))
            assert code == 0, f"on the client machine: {command}\n{out}"
    slowest = ", ".join(f"{r.host}:{r.step.line or r.step.source[:20]} {r.seconds:.1f}s"
                        for r in sorted(runs, key=lambda r: -r.seconds)[:5])
    print(f"{len(runs)} steps in {sum(r.seconds for r in runs):.1f}s; slowest: {slowest}")
    acked = sorted(a.seq for a in audit.read_acks(audit_dir))
    delivered = [d.seq for d in audit.read_deliveries(audit_dir)]
    assert acked == list(range(1000, 1000 + CLIENT_MESSAGES))  # after the doc's 1000
    assert delivered == list(range(1000 + CLIENT_MESSAGES)), "every message of the queue, in order, once"


@pytest.mark.zk
def test_deploying_on_three_machines_runs_as_written_in_the_lab(tmp_path: Path) -> None:
    """docs/OPERATIONS.md, "Deploying on three machines", inside the lab of network namespaces
    (issue 28): each block on the lab host its ``<!-- on: hostN -->`` names (h1-h3, each
    reaching the others at its own lab address only), the client machine h4. Needs root,
    ``ip netns`` and iptables; the lab (namespaces, links, every process in them) is removed
    afterwards whatever happened, by its owner here or, if this process dies, its reaper."""
    from ordq.lab import Lab
    from ordq.lab.netns import in_namespace

    if reason := _no_lab():
        pytest.skip(f"the lab needs root, ip netns and iptables: {reason}")
    started = time.monotonic()
    with Lab.create(tmp_path / "lab", hosts=4) as lab:
        print(f"\nlab of 4 hosts made in {time.monotonic() - started:.1f}s")
        hosts = dict(zip((*MACHINES, "client"), lab.hosts, strict=True))
        deploy_on_three_machines(tmp_path / "run", {m: lab.address(h) for m, h in hosts.items()},
                                 {m: in_namespace(lab.namespace(h), []) for m, h in hosts.items()})
    print(f"deployed, used and removed in {time.monotonic() - started:.1f}s")


@pytest.mark.slow
@pytest.mark.zk
def test_deploying_on_three_machines_runs_as_written_on_loopback(tmp_path: Path) -> None:
    """The same where the lab cannot run (not root, no namespaces): each machine a loopback
    alias (Linux routes all of 127/8 to lo), a random 127.x.y.2-4 so that a parallel run never
    meets this one's fixed ports. Where the lab runs, the test above covers it."""
    import random

    if _no_lab() is None:
        pytest.skip("the lab runs this doc (test_deploying_on_three_machines_runs_as_written_in_the_lab)")
    net = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}"
    addresses = {h: f"{net}.{k}" for k, h in enumerate((*MACHINES, "client"), 2)}
    deploy_on_three_machines(tmp_path / "run", addresses, {h: [] for h in addresses})


def test_three_machines_configs_name_the_whole_ensemble(tmp_path: Path) -> None:
    """Issue 42: the doc's `sed` that makes host2's broker.toml from host3's replaced $HOST3 in
    the `zk` line too, so host2's master listed ZooKeeper node 2 twice and node 3 not at all.
    Runs every line of the section that writes a config file (the `cat > hostN/...toml` blocks
    and the `sed` lines deriving one from another), as written, and checks each host's files:
    every `zk = ...` names the three nodes once each, and each zk.toml lists the three
    servers with that host's own `myid`."""
    text = doc_section("docs/OPERATIONS.md", THREE_MACHINES)
    script = []
    for block in parse_doc("docs/OPERATIONS.md", text):
        body = "\n".join(block.body)
        if block.runs and re.search(r"^cat > host\d/\w+\.toml <<EOF$", body, re.M):
            # only the files' lines: a daemon a block starts afterwards is not part of this check
            lines = block.body
            end = lines.index("EOF", 1) + 1
            script += list(lines[:end]) + [line for line in lines[end:] if line.startswith("sed ")]
    hosts = {"HOST1": "10.9.0.1", "HOST2": "10.9.0.2", "HOST3": "10.9.0.3"}
    ensemble = f"{hosts['HOST1']}:2181,{hosts['HOST2']}:2181,{hosts['HOST3']}:2181"
    for machine in MACHINES:
        (tmp_path / machine).mkdir()
    done = subprocess.run(["bash", "-euc", "\n".join(script)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, **hosts, "ORDQ_ZK": ensemble}, check=False)
    assert done.returncode == 0, done.stderr
    written = sorted(tmp_path.glob("host*/*.toml"))
    assert {p.relative_to(tmp_path).as_posix() for p in written} >= {
        "host1/zk.toml", "host2/zk.toml", "host3/zk.toml", "host2/broker.toml", "host3/broker.toml",
        "host1/coordinator.toml"}
    for path in written:
        lines = path.read_text().splitlines()
        zk_lines = [line for line in lines if line.startswith("zk =")]
        for line in zk_lines:
            assert line == f'zk = "{ensemble}"', f"{path.relative_to(tmp_path)}: {line}"
        if path.name == "zk.toml":
            number = path.parent.name.removeprefix("host")
            assert f"myid = {number}" in lines, f"{path.relative_to(tmp_path)}: {lines}"
            servers = [line for line in lines if line.startswith("host =")]
            assert servers == [f'host = "{hosts[h]}"' for h in ("HOST1", "HOST2", "HOST3")], servers
        elif path.name in ("broker.toml", "coordinator.toml"):
            assert zk_lines, f"{path.relative_to(tmp_path)} names no ZooKeeper"
            own = hosts["HOST" + path.parent.name.removeprefix("host")]
            listens = [line for line in lines if line.startswith(("listen =", "metrics ="))]
            assert listens and all(f'"{own}:' in line for line in listens), listens
