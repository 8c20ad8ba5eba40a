"""The package's layers point down (STYLE §12): a module imports only from its own layer or
the layers below it, and no two layers import each other.

Every import counts, wherever it stands (a lazy import inside a function, or one made only for
the type checker, is a dependency all the same). The layers, top down:

    Face      cli, __main__, demo*, _bench        what users run
    Service   http, client                        the network face and its client
    Runtime   runtime                             workers, duties, dispatcher
    Facade    store, __init__                     validate, one transaction, delegate
    Rules     inbox, tasks, outbox, waits, ...    each rule inside a caller's transaction
    DB        db                                  transactions, dialects, SQL, wake-ups
    Core      errors, models, validation, ...     pure: records, limits, decisions, time
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "postroom"

#: Layers from the ground up; a module belongs to the first layer whose prefix names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("Core", ("errors", "models", "validation", "transitions", "machines", "clock", "faults",
              "settings", "log", "signing", "cron")),
    ("DB", ("db",)),
    ("Rules", ("inbox", "tasks", "outbox", "waits", "receiver", "retention", "status", "queues",
               "schedules", "audit", "transports", "endpoints", "principals", "chains",
               "approvals")),
    ("Facade", ("store", "__init__")),
    ("Runtime", ("runtime",)),
    ("Service", ("http", "client")),
    ("Face", ("cli", "cli_ops", "__main__", "demo", "demo_waits", "demo_handlers", "_bench")),
]
RANK = {name: rank for rank, (name, _) in enumerate(LAYERS)}


def layer_of(module: str) -> str:
    """The layer of ``postroom.<module>`` (dotted below the package, e.g. ``db.sqlite``)."""
    head = module.split(".", 1)[0]
    for name, members in LAYERS:
        if head in members:
            return name
    raise AssertionError(f"postroom.{module} is in no layer: add it to LAYERS in {__file__}")


def modules() -> dict[str, Path]:
    """Every module of the package, by its dotted name below ``postroom``."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(path: Path, module: str) -> set[str]:
    """The postroom modules ``path`` imports, dotted below ``postroom``.

    ``from postroom import Store`` is an import of the package's face (``__init__``);
    ``from postroom import faults`` one of ``faults``.
    """
    package = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(["postroom", *package[:len(package) - node.level + 1], base])
            names = [f"{base.strip('.')}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name == "postroom" or name.startswith("postroom."):
                found.add(_known(name.split(".")[1:]))
    found.discard(module)
    return found


def _known(parts: list[str]) -> str:
    """The longest prefix of ``parts`` that is a module: ``db.Tx`` is module ``db``, and a
    name the package itself hands on is its face, ``__init__``."""
    known = modules()
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return "__init__"


def arrows() -> set[tuple[str, str]]:
    """Every (importer, imported) pair of layers, including within a layer."""
    found = set()
    for module, path in modules().items():
        for target in imports(path, module):
            found.add((layer_of(module), layer_of(target)))
    return found


def upward(edges: set[tuple[str, str]]) -> list[str]:
    """The arrows that run from a layer to one above it."""
    return sorted(f"{source} -> {target}" for source, target in edges
                  if RANK[target] > RANK[source])


def test_every_module_belongs_to_a_layer():
    for module in modules():
        layer_of(module)


def test_no_module_imports_from_a_layer_above_its_own():
    problems = []
    for module, path in modules().items():
        for target in imports(path, module):
            if RANK[layer_of(target)] > RANK[layer_of(module)]:
                problems.append(f"postroom.{module} ({layer_of(module)}) imports "
                                f"postroom.{target} ({layer_of(target)})")
    assert problems == []


def test_no_two_layers_import_each_other():
    edges = {(source, target) for source, target in arrows() if source != target}
    assert sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges) == []


def test_the_whiteboard_draws_these_layers_and_only_downward_arrows():
    # layers.json is the picture `farm-studio draw layers.json` checks the house against.
    board = json.loads((PACKAGE.parents[1] / "layers.json").read_text("utf-8"))
    drawn = {name: sorted(room.removeprefix("src/postroom/").removesuffix("/")
                          .removesuffix(".py") for room in part["is"])
             for name, part in board["parts"].items()}
    assert drawn == {name: sorted(members) for name, members in LAYERS}
    assert [f"{a} -> {b}" for a, b in board["arrows"] if RANK[b] >= RANK[a]] == []
    assert [f"{a} -> {b}" for a, b, _ in board["never"] if RANK[b] < RANK[a]
            and (a, b) in arrows()] == []


def test_the_checker_finds_an_upward_import(tmp_path, monkeypatch):
    # The walk is only worth something if it sees a violation: plant one and look.
    planted = tmp_path / "postroom"
    for path in PACKAGE.rglob("*.py"):
        target = planted / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text("utf-8"), "utf-8")
    tasks = planted / "tasks.py"
    tasks.write_text(tasks.read_text("utf-8") + "\nfrom postroom.store import Store\n", "utf-8")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", planted)
    assert "Rules -> Facade" in upward(arrows())


def test_only_the_bench_command_imports_the_benchmarks():
    for module, path in modules().items():
        if module.startswith("_bench"):
            continue
        tree = ast.parse(path.read_text("utf-8"))
        top_level = {node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "postroom._bench"):
                assert module == "cli" and node not in top_level, (
                    f"postroom.{module} imports {node.module} outside the bench command")


@pytest.mark.parametrize("forbidden", ["postroom._bench", "multiprocessing"])
def test_postroom_help_imports_no_benchmark_module_and_no_multiprocessing(forbidden):
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "postroom", "--help"],
                            capture_output=True, text=True, check=True, timeout=60)
    imported = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")]
    assert "click" in imported  # the walk reads what it should
    assert [name for name in imported if name.split(".")[0] == forbidden.split(".")[0]
            and name.startswith(forbidden)] == []
