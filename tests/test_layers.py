"""One namespace, one direction (docs/CONTRIBUTING.md, "The map"): no module imports back a
module that imports it, nothing is importable outside ``ordq.``, and ``from ordq import ...``
offers the SDK. The layers themselves are import-linter's contract in pyproject.toml
(``make lint``); these checks cover what a contract per package cannot: cycles that cross
packages, and the names a wheel would install."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("coordinator", "broker_group", "sdk", "spark_order_check", "drills")


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the chain of imports (< 50 here)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return cycles


def test_no_module_imports_back_what_imports_it() -> None:
    graph = grimp.build_graph("ordq")  # TYPE_CHECKING and function-level imports count too
    assert len(graph.modules) > 100, "the graph missed the linked packages"
    assert import_cycles(graph) == []


def test_every_package_and_module_of_ordq_has_a_layer() -> None:
    """A new module must be placed in the layers contract, or the contract never checks it."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    # the package's layers (a contract with ``containers`` orders modules inside one package)
    (layers,) = [c["layers"] for c in config if c["type"] == "layers" and "containers" not in c]
    named = {m.strip() for layer in layers for m in re.split(r"[:|]", layer)}
    children = set(grimp.build_graph("ordq").find_children("ordq"))
    assert children - named == set(), "add these to a layer in pyproject.toml's layers contract"


def test_a_cycle_is_found() -> None:
    """The check above can fail: one import back closes a cycle it reports."""
    graph = grimp.build_graph("ordq")
    graph.add_import(importer="ordq.common.errors", imported="ordq.sdk.producer")
    assert any("ordq.common.errors" in c and "ordq.sdk.producer" in c for c in import_cycles(graph))


def test_the_folders_are_ordq_packages_and_nothing_imports_them_by_their_own_name() -> None:
    for name in FOLDERS:
        link = REPO / "ordq" / name
        assert link.is_symlink() and link.resolve() == REPO / name, f"ordq/{name} must link to {name}/"
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == ["ordq*"]
    files = subprocess.run(["git", "ls-files", "*.py", "*.md"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    bare = re.compile(rf"^\s*(from|import) ({'|'.join(FOLDERS)})(\.| |$)", re.M)
    offenders = [f for f in files if not (REPO / f).is_symlink() and bare.search((REPO / f).read_text())]
    assert offenders == [], "import these as ordq.<name>, or two module objects exist for one file"


def test_ordq_offers_the_sdk_and_loads_it_only_when_asked() -> None:
    probe = ("import sys, ordq, ordq.common.errors\n"
             "assert 'ordq.sdk' not in sys.modules\n"
             "from ordq import Producer, Consumer\n"
             "import ordq.sdk\n"
             "assert set(ordq.__all__) - {'__version__'} == set(ordq.sdk.__all__)\n"
             "assert Producer is ordq.sdk.Producer and Consumer is ordq.sdk.Consumer\n")
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=REPO)


def test_the_sdk_and_the_client_commands_load_no_zookeeper_client() -> None:
    """Issue 37: clients speak only to the cluster (the coordinators), so neither the SDK nor
    the commands that run clients (produce, consume) may load kazoo, even by a path rarely taken."""
    probe = ("import importlib, pkgutil, sys\n"
             "import ordq.sdk\n"
             "for m in pkgutil.walk_packages(ordq.sdk.__path__, 'ordq.sdk.'):\n"
             "    importlib.import_module(m.name)\n"
             "importlib.import_module('ordq.commands.clients')\n"
             "loaded = sorted(k for k in sys.modules if k.split('.')[0] == 'kazoo')\n"
             "assert not loaded, loaded\n")
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=REPO)
