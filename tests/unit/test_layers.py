"""The package layers of docs/architecture.md, checked on the source (parsed, never imported).

Layers only point down: ``election`` <- ``ledger``, ``snapshots`` <- ``broker`` <- ``cli``,
``bench``; ``pipeline`` reads through ``ledger``, ``snapshots``, ``election`` and the broker's
state modules; ``devtools`` may use anything, but nothing in the product imports it. Imports
inside functions count as much as module-level ones: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast

from tests.support.source_graph import PACKAGES, ROOT, TOP_MODULES, import_graph, imports_of, module_files

# Top-level modules that belong to another name's layer.
LAYER_OF = {"cli_options": "cli", "cli_lifecycle": "cli"}

# What each top-level name may import besides itself. A name missing from a set is a higher
# (or sideways) layer.
ALLOWED: dict[str, set[str]] = {
    "election": set(),
    "ledger": {"election"},
    "snapshots": {"election"},
    "broker": {"election", "ledger", "snapshots"},
    "pipeline": {"election", "ledger", "snapshots", "broker"},
    "cli": {"election", "ledger", "snapshots", "broker", "pipeline", "devtools", "bench"},
    "bench": {"election", "ledger", "snapshots", "broker", "pipeline", "devtools"},
    "devtools": {"election", "ledger", "snapshots", "broker", "pipeline", "bench", "cli"},
}

# pipeline may read the broker's replicated state, not its server or client side.
PIPELINE_BROKER_MODULES = ("broker", "broker.state.")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def _layer(module: str) -> str:
    top = module.split(".")[0]
    return LAYER_OF.get(top, top)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module, targets in sorted(graph.items()):
        layer = _layer(module)
        for target in sorted(targets):
            other = _layer(target)
            if other == layer:
                continue
            if other not in ALLOWED[layer]:
                problems.append(f"{module} -> {target} ({layer} may not import {other})")
            elif (
                layer == "pipeline"
                and other == "broker"
                and not (target == "broker" or target.startswith(PIPELINE_BROKER_MODULES[1:]))
            ):
                problems.append(f"{module} -> {target} (pipeline may use only the broker's state modules)")
    return problems


def test_the_walk_sees_every_package_and_lazy_imports():
    graph = import_graph()
    for package in PACKAGES + TOP_MODULES:
        assert package in graph, package
    # cli imports the broker both at module level and inside commands; both are seen.
    assert any(target.startswith("broker") for target in graph["cli"])


def test_cycle_and_layer_checks_catch_what_they_name():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    bad = {
        "election.x": {"broker.server.node"},
        "broker.server.node": set(),
        "pipeline.y": {"broker.server.request_loop"},
        "broker.server.request_loop": set(),
        "ledger.z": {"devtools.chaos"},
        "devtools.chaos": set(),
    }
    assert layer_violations(bad) == [
        "election.x -> broker.server.node (election may not import broker)",
        "ledger.z -> devtools.chaos (ledger may not import devtools)",
        "pipeline.y -> broker.server.request_loop (pipeline may use only the broker's state modules)",
    ]


def test_lazy_import_inside_a_function_counts(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from broker.state.store import StateStore\n")
    assert imports_of("snapshots.mod", source, {"broker.state.store", "broker"}) == {"broker.state.store"}


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_layers_only_point_down():
    problems = layer_violations(import_graph())
    assert not problems, "layer violations:\n" + "\n".join(problems)


def test_node_parts_do_not_reach_back_into_the_node():
    # The takeover, the live publisher and the checkpointer get what they need passed in
    # (CheckpointHost, constructor arguments): none of them may import the node.
    graph = import_graph()
    for part in (
        "broker.server.standing.takeover",
        "broker.server.live",
        "broker.server.store.checkpoints",
        "broker.server.stop_budget",
        "broker.server.standing.candidacy",
    ):
        assert "broker.server.node" not in graph[part], f"{part} imports broker.server.node"
    assert {
        "broker.server.standing.takeover",
        "broker.server.live",
        "broker.server.store.checkpoints",
    } <= graph["broker.server.node"]


def collaborator_writes(source: str) -> list[str]:
    """Lines that hand an object a collaborator from outside: ``other.on_x = ...`` or ``other.x = lambda``.

    Collaborators (callbacks, hooks) are passed to constructors, as a frozen hooks dataclass
    where there are several; setting one on a live object from outside hides who calls whom.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if not isinstance(target, ast.Attribute):
                continue
            owner = target.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if target.attr.startswith("on_") or isinstance(node.value, ast.Lambda):
                found.append(f"line {node.lineno}: {ast.unparse(target)} = {ast.unparse(node.value)[:60]}")
    return found


def test_the_collaborator_check_catches_what_it_names():
    assert collaborator_writes("server.on_fatal = node.fail\nx.hook = lambda: 1\nself.on_y = f\n") == [
        "line 1: server.on_fatal = node.fail",
        "line 2: x.hook = lambda: 1",
    ]


def test_collaborators_are_passed_to_constructors_not_set_from_outside():
    problems = []
    for name, path in sorted(module_files().items()):
        if _layer(name) in ("devtools", "bench"):
            continue
        problems += [f"{name} {line}" for line in collaborator_writes(path.read_text())]
    assert not problems, "collaborators set from outside:\n" + "\n".join(problems)


def test_no_test_module_imports_another():
    # Shared helpers live in tests/support/: a test module that imports another runs the
    # other's module-level code and ties the two files' edits together.
    tests_root = ROOT / "tests"
    problems = []
    for path in sorted(tests_root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_"):
                    problems.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not problems, "test modules importing test modules:\n" + "\n".join(problems)
