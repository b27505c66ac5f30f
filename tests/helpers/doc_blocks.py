"""Docs are tests: the fenced blocks of a Markdown file, and the matcher of their output.

Pure (no I/O beyond reading the file): ``tests/helpers/doc_session.py`` runs what this module
extracts, ``tests/test_docs.py`` ties them together. The convention a doc follows (for
writers: docs/CONTRIBUTING.md):

- **Opting in.** A file runs as a test when it holds a line ``<!-- doc-test -->``
  (README.md, docs/CLI.md and docs/SDK.md must). Its blocks run in document order, in one
  fresh, empty folder (the root of a checkout, as far as the doc can tell: ``.venv`` is there),
  in one bash session, with ``ORDQ_ZK`` set to a free port; the doc starts what it needs
  (``ordq up``) and whatever it leaves running is stopped and wiped afterwards.
- **``$`` blocks.** In a fenced block (any info string but ``markdown``), a line starting
  ``$ `` is a shell command; the lines after it, up to the next ``$ `` line or the end of the block, are what it
  prints (stdout and stderr together, as on a terminal). A last line ``[exit N]`` says it
  exits N; otherwise it must exit 0. Matching is line by line: ``...`` inside a line matches
  any text, a line that is only ``...`` matches any number of lines (none too), runs of
  whitespace compare equal (tables), trailing whitespace is ignored. So pids, ports,
  durations, timestamps and generated ids are written ``...``. A command with nothing after
  it must print nothing. A ``$`` line ending in ``\\`` continues on the next line.
- **Plain shell blocks** (``bash``/``sh``/``shell``, no ``$`` line): each line (``\\``
  continues it, a here-document ``<<EOF`` runs to its ``EOF`` line; ``#`` comments and blank
  lines skipped) runs in the same session and must exit 0; what it prints is not checked.
- **Python blocks** (``python``): run in order in one Python process per doc, sharing their
  globals (like a REPL session, or doctest), so a later block can use ``cfg`` from an earlier
  one; each must finish without an exception. A block directly followed by an ``output``
  block must print exactly that (same matching; ``[exit 1]`` there means it must raise).
- **Not run**: other blocks (``text``, ``json``, synopses without ``$``, ``markdown``
  quoting a doc), and a block whose
  preceding line is ``<!-- doc-test: skip REASON -->`` (the reason is required, e.g. "this is
  what CI runs").
- **Where a block runs** (a doc deploying on several machines, docs/OPERATIONS.md): a comment
  ``<!-- on: host2 -->`` among the comment lines before a block names the machine
  (``Block.host``; ``every host``: each of them): run with a session per machine
  (``doc_session.run_doc``), the block runs in that machine's, inside its host of the lab of
  network namespaces (or, where no lab can run, on a loopback alias).
- ``127.0.0.1:2181`` (the default ZooKeeper address) stands for the session's ZooKeeper:
  replaced by its real address in commands and Python code, and the real address is shown
  as ``127.0.0.1:2181`` in what they print, so a doc reads as on a fresh machine.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import attrs

OPT_IN = "<!-- doc-test -->"
ON_RE = re.compile(r"^<!--\s*on:\s*(?P<host>.*?)\s*-->\s*$")
SKIP_RE = re.compile(r"^<!--\s*doc-test:\s*skip\b\s*(?P<reason>.*?)\s*-->\s*$")
EXIT_RE = re.compile(r"^\[exit (?P<code>\d+)\]$")
FENCE_RE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
SHELL_INFOS = {"bash", "sh", "shell", "console"}
PYTHON_INFOS = {"python", "py"}
MARKDOWN_INFOS = {"markdown", "md"}  # a doc quoting a doc: shown, never run
ELLIPSIS = "..."
# The addresses a doc shows for the ZooKeeper it talks to (the CLI's and the SDK's default).
DOC_ZK = "127.0.0.1:2181"


class DocFormatError(ValueError):
    """The doc breaks the convention (an unclosed fence, a skip without a reason, ...)."""


@attrs.frozen
class Expected:
    """What a command or script must print and how it must exit."""

    lines: tuple[str, ...]
    exit_code: int = 0
    line: int = 0  # doc line of the first expected line


@attrs.frozen
class Step:
    """One thing to run: a shell command (``kind`` "check": output compared, "run": only
    the exit code) or a Python block ("python")."""

    kind: str
    source: str  # the command, or the Python code
    line: int  # 1-based doc line where it starts
    expected: Expected | None = None  # None: not compared (a plain shell line)


@attrs.frozen
class Block:
    path: str  # as given, for messages
    line: int  # line of the opening fence
    info: str
    body: tuple[str, ...]
    skip_reason: str | None = None
    steps: tuple[Step, ...] = ()
    host: str | None = None  # the machine it runs on (``<!-- on: NAME -->``), if the doc says

    @property
    def runs(self) -> bool:
        return bool(self.steps) and self.skip_reason is None


def opted_in(text: str) -> bool:
    return any(line.strip() == OPT_IN for line in text.splitlines())


def parse_doc(path: str, text: str) -> list[Block]:
    """Every fenced block of the doc, with the steps it runs (none for a block not run)."""
    lines = text.splitlines()
    raw = _fenced_blocks(path, lines)
    blocks: list[Block] = []
    i = 0
    while i < len(raw):
        start, info, body, skip = raw[i]
        if info == "output":
            raise DocFormatError(f"{path}:{start}: an `output` block must directly follow a python block")
        steps: tuple[Step, ...] = ()
        if info in PYTHON_INFOS:
            expected = None
            if i + 1 < len(raw) and raw[i + 1][1] == "output" and _adjacent(lines, start, body, raw[i + 1][0]):
                out_start, _, out_body, _ = raw[i + 1]
                expected = _expected(path, out_start + 1, list(out_body))
                i += 1
            steps = (Step("python", "\n".join(body) + "\n", start + 1,
                          expected or Expected((ELLIPSIS,), 0, start + 1)),)
        elif info not in MARKDOWN_INFOS and any(line.startswith("$ ") for line in body):
            steps = _dollar_steps(path, start, body)
        elif info in SHELL_INFOS:
            steps = _shell_steps(start, body)
        blocks.append(Block(path, start, info, tuple(body), skip, steps, _on_host(lines, start - 1)))
        i += 1
    return blocks


def _fenced_blocks(path: str, lines: list[str]) -> list[tuple[int, str, tuple[str, ...], str | None]]:
    """(fence line, info string, body lines, skip reason) of every fenced block."""
    out = []
    i = 0
    while i < len(lines):
        m = FENCE_RE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        start = i + 1
        skip = _skip_reason(path, lines, i)
        body = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence) and set(lines[i].strip()) == {fence[0]}):
            line = lines[i]
            body.append(line[indent:] if line[:indent].isspace() or not indent else line.lstrip())
            i += 1
        if i == len(lines):
            raise DocFormatError(f"{path}:{start}: fenced block never closed")
        out.append((start, m["info"].lower(), tuple(body), skip))
        i += 1
    return out


def _on_host(lines: list[str], fence_index: int) -> str | None:
    """The ``<!-- on: NAME -->`` among the blank and comment lines right above a fence."""
    j = fence_index - 1
    while j >= 0 and (not lines[j].strip() or lines[j].strip().startswith("<!--")):
        if m := ON_RE.match(lines[j].strip()):
            return m["host"]
        j -= 1
    return None


def _skip_reason(path: str, lines: list[str], fence_index: int) -> str | None:
    j = fence_index - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j < 0:
        return None
    m = SKIP_RE.match(lines[j].strip())
    if not m:
        return None
    if not m["reason"].strip(" :—-"):
        raise DocFormatError(f"{path}:{j + 1}: a doc-test skip needs a reason")
    return m["reason"].strip(" :—-")


def _adjacent(lines: list[str], start: int, body: tuple[str, ...], next_start: int) -> bool:
    """Only blank lines between the end of one block and the next fence."""
    close = start + len(body) + 1  # 1-based line of the closing fence
    return all(not line.strip() for line in lines[close:next_start - 1])


HEREDOC_RE = re.compile(r"<<-?\s*(?P<q>['\"]?)(?P<word>[A-Za-z_][A-Za-z0-9_]*)(?P=q)")


def _join_continued(items: list[tuple[int, str]]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    heredoc: str | None = None  # the word that ends the here-document being read
    for n, text in items:
        if pending is not None:
            n, text = pending[0], pending[1] + "\n" + text
            pending = None
        if heredoc is not None:
            if text.rsplit("\n", 1)[-1].strip() != heredoc:
                pending = (n, text)
                continue
            heredoc = None
        elif m := HEREDOC_RE.search(text):
            heredoc = m["word"]
            pending = (n, text)
            continue
        if text.endswith("\\"):
            pending = (n, text)
            continue
        out.append((n, text))
    if pending is not None:
        out.append(pending)
    return out


def _dollar_steps(path: str, start: int, body: tuple[str, ...]) -> tuple[Step, ...]:
    steps = []
    i = 0
    if not body[0].startswith("$ "):
        raise DocFormatError(f"{path}:{start + 1}: a block with `$ ` commands must start with one")
    while i < len(body):
        line_no = start + 1 + i
        command = body[i][2:]
        i += 1
        while command.endswith("\\") and i < len(body):
            command += "\n" + body[i]
            i += 1
        out = []
        out_line = start + 1 + i
        while i < len(body) and not body[i].startswith("$ "):
            out.append(body[i])
            i += 1
        steps.append(Step("check", command, line_no, _expected(path, out_line, out)))
    return tuple(steps)


def _shell_steps(start: int, body: tuple[str, ...]) -> tuple[Step, ...]:
    items = [(start + 1 + i, line) for i, line in enumerate(body)]
    return tuple(Step("run", text, n) for n, text in _join_continued(items)
                 if text.strip() and not text.lstrip().startswith("#"))


def _expected(path: str, line: int, out: list[str]) -> Expected:
    while out and not out[-1].strip():
        out.pop()
    code = 0
    if out and (m := EXIT_RE.match(out[-1].strip())):
        code = int(m["code"])
        out.pop()
    return Expected(tuple(out), code, line)


# -- matching ---------------------------------------------------------------------------------


def _line_regex(expected: str) -> re.Pattern[str]:
    out = []
    for piece in re.split(r"(\.{3,}|\s+)", expected.rstrip()):
        if piece.startswith(ELLIPSIS):
            # `...` next to literal dots ("1....", "....txt"): those dots on either side
            extra = len(piece) - 3
            out.append("(?:" + "|".join(rf"\.{{{a}}}.*\.{{{extra - a}}}" for a in range(extra + 1)) + ")")
        elif piece and piece.isspace():
            out.append(r"\s+")
        else:
            out.append(re.escape(piece))
    return re.compile("".join(out))


def line_matches(expected: str, actual: str) -> bool:
    return _fits(_line_regex(expected), actual)


def _fits(rx: re.Pattern[str], actual: str) -> bool:
    # trailing whitespace is ignored, unless the doc's line ends in "<space>..."
    return rx.fullmatch(actual.rstrip()) is not None or rx.fullmatch(actual) is not None


def match_lines(expected: list[str] | tuple[str, ...], actual: list[str]) -> int | None:
    """None when ``actual`` matches ``expected``; else the index of the first expected line
    that no alignment gets past (``len(expected)`` when actual has lines left over)."""
    exp = list(expected)
    regexes = [None if e.strip() == ELLIPSIS else _line_regex(e) for e in exp]
    n, m = len(exp), len(actual)
    # reach[i] = set of j such that exp[:i] can match actual[:j]
    reach: list[set[int]] = [set() for _ in range(n + 1)]
    reach[0] = {0}
    for i in range(n):
        rx = regexes[i]
        if rx is None:  # any number of lines: from the first place reached on
            reach[i + 1] = set(range(min(reach[i]), m + 1))
        else:
            reach[i + 1] = {j + 1 for j in reach[i] if j < m and _fits(rx, actual[j])}
        if not reach[i + 1]:
            return i
    return None if m in reach[n] else n


@attrs.frozen
class Mismatch:
    """Why a step failed, ready to print: where in the doc, what was expected, what came."""

    path: str
    step: Step
    actual: tuple[str, ...]
    exit_code: int | None  # None: it did not finish (timed out)
    why: str

    def render(self) -> str:
        exp = self.step.expected
        head = f"{self.path}:{self.step.line}: {self.why}\n  {self._shown()}"
        if exp is None:
            return head + "\n  output:\n" + _indent(self.actual)
        diff = difflib.unified_diff(
            [*exp.lines, *([f"[exit {exp.exit_code}]"] if exp.exit_code else [])],
            [*self.actual, *([f"[exit {self.exit_code}]"] if self.exit_code else [])],
            fromfile=f"{self.path}:{exp.line} (the doc)", tofile="what it printed", lineterm="", n=3,
        )
        return head + "\n" + "\n".join(diff)

    def _shown(self) -> str:
        first = self.step.source.strip().splitlines()[0] if self.step.source.strip() else ""
        return ("$ " if self.step.kind != "python" else "python: ") + first


def _indent(lines: tuple[str, ...]) -> str:
    return "\n".join("    " + line for line in lines) or "    (nothing)"


def check(path: str, step: Step, output: str, exit_code: int | None) -> Mismatch | None:
    """Compare what a step printed and its exit code with what the doc says."""
    actual = tuple(output.splitlines())
    if exit_code is None:
        return Mismatch(path, step, actual, None, "did not finish in time")
    exp = step.expected
    if exp is None:
        if exit_code != 0:
            return Mismatch(path, step, actual, exit_code, f"exited {exit_code} (a plain shell line must exit 0)")
        return None
    bad = match_lines(exp.lines, list(actual))
    if bad is not None:
        where = exp.line + bad if bad < len(exp.lines) else exp.line + len(exp.lines)
        what = (f"output differs from the doc from its line {where}" if bad < len(exp.lines)
                else f"it printed more than the doc shows (after line {where - 1})")
        return Mismatch(path, step, actual, exit_code, what)
    if exit_code != exp.exit_code:
        return Mismatch(path, step, actual, exit_code, f"exited {exit_code}, the doc says {exp.exit_code}")
    return None


def doc_files(root: Path, required: tuple[str, ...]) -> list[str]:
    """The docs that opted in (relative to ``root``): ``required`` first, then any other
    ``*.md`` at the top or under docs/ holding the opt-in line."""
    found = [*required]
    for p in sorted([*root.glob("*.md"), *root.glob("docs/*.md")]):
        rel = p.relative_to(root).as_posix()
        if rel not in found and opted_in(p.read_text()):
            found.append(rel)
    return found
