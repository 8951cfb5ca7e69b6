"""The package layers of docs/architecture.md, checked on the source (parsed, never imported).

Layers only point down: ``election`` <- ``ledger``, ``snapshots`` <- ``broker`` <- ``commands``,
``bench``; ``pipeline`` reads through ``ledger``, ``snapshots``, ``election`` and the broker's
state modules; ``cli`` holds the root command group and imports only ``commands``, whose development
groups (``commands.dev``, ``zk``, ``bench``, ``chaos``) are the only product modules that call into
``devtools``; ``devtools`` may use anything but the command line, and nothing in the product imports
it. Every package at the root and every top-level module is checked. Imports inside functions count
as much as module-level ones: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast

from tests.support.source_graph import PACKAGES, ROOT, TOP_MODULES, import_graph, imports_of, module_files

# What each top-level name may import besides itself. A name missing from a set is a higher
# (or sideways) layer.
ALLOWED: dict[str, set[str]] = {
    "election": set(),
    "ledger": {"election"},
    "snapshots": {"election"},
    "broker": {"election", "ledger", "snapshots"},
    "pipeline": {"election", "ledger", "snapshots", "broker"},
    "fencepost": {"election", "ledger", "snapshots", "broker"},
    "commands": {"election", "ledger", "snapshots", "broker", "pipeline", "bench", "devtools"},
    "cli": {"commands"},
    "bench": {"election", "ledger", "snapshots", "broker", "pipeline", "devtools"},
    "devtools": {"election", "ledger", "snapshots", "broker", "pipeline", "bench"},
}

# pipeline may read the broker's replicated state, not its server or client side.
PIPELINE_BROKER_MODULES = ("broker", "broker.state.")
# The development command groups: the only command modules that may call into devtools.
DEV_COMMANDS = ("commands.dev", "commands.zk", "commands.bench", "commands.chaos")


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
    return module.split(".")[0]


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
            elif layer == "commands" and other == "devtools" and module not in DEV_COMMANDS:
                problems.append(f"{module} -> {target} (only the development commands may import devtools)")
    return problems


def test_the_walk_sees_every_package_and_lazy_imports():
    graph = import_graph()
    for package in PACKAGES + TOP_MODULES:
        assert package in graph, package
    assert {"commands", "cli", "fencepost"} <= set(PACKAGES + TOP_MODULES)
    # A command module imports the shared options at module level and the broker inside its
    # commands; both are seen.
    assert "commands.options" in graph["commands.status"]
    assert any(target.startswith("broker.admin") for target in graph["commands.status"])
    assert "commands.task" in graph["cli"]


def test_every_package_and_top_level_module_has_a_layer():
    unplaced = sorted(set(PACKAGES + TOP_MODULES) - set(ALLOWED))
    assert not unplaced, f"give these a layer in ALLOWED: {unplaced}"


def test_cycle_and_layer_checks_catch_what_they_name():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    bad = {
        "election.x": {"broker.server.node"},
        "broker.server.node": set(),
        "pipeline.y": {"broker.server.request_loop"},
        "broker.server.request_loop": set(),
        "ledger.z": {"devtools.chaos"},
        "devtools.chaos": {"commands.options"},
        "commands.task": {"devtools.devcluster", "broker.api.client"},
        "commands.dev": {"devtools.devcluster"},
        "commands.options": set(),
        "cli": {"commands.task", "broker.api.client"},
        "broker.api.client": {"commands.output"},
    }
    assert layer_violations(bad) == [
        "broker.api.client -> commands.output (broker may not import commands)",
        "cli -> broker.api.client (cli may not import broker)",
        "commands.task -> devtools.devcluster (only the development commands may import devtools)",
        "devtools.chaos -> commands.options (devtools may not import commands)",
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


def _builds_command(func: ast.expr) -> bool:
    return isinstance(func, ast.Attribute) and func.attr in ("command", "group", "Command", "Group")


def command_definitions(source: str) -> list[str]:
    """The functions ``source`` makes click commands or groups of, and any other click command it builds."""
    tree = ast.parse(source)
    decorators = {
        id(decorator)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for decorator in node.decorator_list
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(_builds_command(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list):
                found.append(node.name)
        elif isinstance(node, ast.Call) and id(node) not in decorators and _builds_command(node.func):
            found.append(ast.unparse(node)[:60])
    return found


def test_the_command_check_catches_what_it_names():
    source = (
        "@click.group()\ndef main(): pass\n"
        "@main.command('x')\ndef x(): pass\n"
        "main.add_command(click.Command('y'))\n"
    )
    assert command_definitions(source) == ["main", "x", "click.Command('y')"]


def test_cli_defines_only_the_root_group():
    # Every other command lives in its group's module of commands/; cli.py only adds them.
    assert command_definitions((ROOT / "cli.py").read_text()) == ["main"]


def test_node_parts_do_not_reach_back_into_the_node():
    # The node's parts (the start, the services, the store in service, a leadership term with its
    # takeover, the live publisher, the checkpointer, the orderly stop) get what they need passed in
    # (CheckpointHost, constructor arguments): none of them may import the node, which wires them.
    graph = import_graph()
    parts = {
        "broker.server.startup",
        "broker.server.services",
        "broker.server.store.running",
        "broker.server.standing.term",
        "broker.server.live",
        "broker.server.store.checkpoints",
        "broker.server.orderly_stop",
    }
    for part in sorted(
        parts
        | {"broker.server.standing.takeover", "broker.server.stop_budget", "broker.server.standing.candidacy"}
    ):
        assert "broker.server.node" not in graph[part], f"{part} imports broker.server.node"
    assert parts <= graph["broker.server.node"]
    assert "broker.server.standing.takeover" in graph["broker.server.standing.term"]


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
    # Shared helpers live in tests/support/: a test module that imports another (or a conftest,
    # which is for fixtures and hooks) runs the other's module-level code and ties the two
    # files' edits together.
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
                last = name.rsplit(".", 1)[-1]
                if name.startswith("tests.") and (last.startswith("test_") or last == "conftest"):
                    problems.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not problems, "test modules importing test modules:\n" + "\n".join(problems)
