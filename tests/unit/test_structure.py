"""The layout rules that keep every idea in one room, checked over the package's source:
the runtime never names an algorithm or reads its keys; transition columns are named
through ``Col`` only; no two parts of the package import each other, even from inside a
function; no module is longer than 500 lines."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import tomllib

from rlinf_user.algorithms.base import ALGORITHMS
from rlinf_user.env.spec import Col

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rlinf_user"

# the parts that run any algorithm: they ask it (its data plan, checks, store), never test it
ALGORITHM_BLIND = [PACKAGE / "runtime", PACKAGE / "config", PACKAGE / "evaluation.py", PACKAGE / "cli"]


def _files(paths) -> list[Path]:
    out = []
    for p in paths:
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


def _algo_access(node: ast.AST) -> str | None:
    """``cfg.algo.<key>`` (other than ``name``) or ``cfg.algo.get(...)``: the run config's algorithm section."""
    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "algo"):
        return None
    owner = node.value.value
    owner_name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
    if owner_name != "cfg" or node.attr == "name":
        return None
    return node.attr


def test_the_runtime_never_names_an_algorithm_nor_reads_its_keys():
    names = set(ALGORITHMS.names())
    found = []
    for path in _files(ALGORITHM_BLIND):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.append(f"{where} names algorithm {node.value!r}")
            key = _algo_access(node)
            if key is not None:
                found.append(f"{where} reads algo.{key}")
    assert not found, "ask the algorithm (data_plan, problems, run_problems, configure) instead:\n" + "\n".join(found)


def test_every_algorithm_declares_its_config_plan_and_family():
    from rlinf_user.algorithms.base import OnPolicyPlan, ReplayPlan

    for name in ALGORITHMS.names():
        cls = ALGORITHMS.get(name)
        assert cls.config.name == name, f"{name}: its config's name is {cls.config.name!r}"
        plan = cls.data_plan(cls.config())
        assert isinstance(plan, (ReplayPlan, OnPolicyPlan)), name
        assert cls.resumes(name)


def test_every_policy_and_algorithm_brings_its_own_typed_config():
    """No shared flat config: each registered class holds a dataclass of its own keys, and its
    YAML pulls that schema in; a key the chosen policy does not declare is refused by name."""
    import dataclasses

    import pytest

    import rlinf_user.config.schema as schema
    from rlinf_user.config.compose import ConfigError, compose_config
    from rlinf_user.policies.base import POLICIES

    assert not hasattr(schema, "PolicyConfig")
    for group, table in (("algo", ALGORITHMS), ("policy", POLICIES)):
        for name in table.names():
            config = table.get(name).config
            assert dataclasses.is_dataclass(config) and "name" in config.__dataclass_fields__, (group, name)
            text = (ROOT / "configs" / group / f"{name}.yaml").read_text()
            assert f"/{group}_schema@_here_: {name}" in text, f"configs/{group}/{name}.yaml does not pull in its schema"
    flow_keys = set(compose_config(["policy=flow"], sim="reach").policy)
    assert {"flow_steps", "encoder"} <= flow_keys and "lora_rank" not in flow_keys
    with pytest.raises(ConfigError, match="policy.hidden: not a key of the chosen policy"):
        compose_config(["policy=pi0", "policy.hidden=[3]"], sim="reach")


# the learning side, where dicts of transition columns (and observations) travel; the edge
# speaks its own wire format (rlinf_user.edge.protocol) and the env contract its own spaces
COLUMN_SIDE = [PACKAGE / d for d in ("algorithms", "data", "runtime", "reward", "teleop", "cli", "evaluation.py")]
COLUMN_SIDE.append(ROOT / "policies")
# containers that are not transitions: configs, records of episodes and evaluations, wire messages
NOT_COLUMNS = {"cfg", "config", "rw", "iv", "env", "hg", "placement_cfg", "res", "body", "recorded", "now", "info",
               "infos", "result", "best", "row", "ep", "e", "r", "summary", "s", "test", "msg", "arrays", "meta"}  # fmt: skip
COLUMN_NAMES = {v for k, v in vars(Col).items() if k.isupper() and isinstance(v, str)}


def _container(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute) and node.attr in NOT_COLUMNS:
            return node.attr
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_column(value: object) -> bool:
    if not isinstance(value, str):
        return False
    head, _, tail = value.partition("/")
    return value in COLUMN_NAMES or (bool(tail) and head in (Col.OBS, Col.NEXT_OBS))


def _column_literals(tree: ast.AST) -> list[ast.Constant]:
    """String literals used as a column's name: a subscript, ``get``/``pop``/``in`` on a
    container of columns, or the keys of a dict whose keys are all column names."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            if _container(node.value) not in NOT_COLUMNS:
                out.append(node.slice)
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if isinstance(k, ast.Constant)]
            if keys and all(_is_column(k.value) for k in keys):
                out += keys
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop"):
            if node.args and isinstance(node.args[0], ast.Constant) and _container(node.func.value) not in NOT_COLUMNS:
                out.append(node.args[0])
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
            if any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops) and _container(node.comparators[0]) not in NOT_COLUMNS:
                out.append(node.left)
    return [k for k in out if _is_column(k.value)]


def test_transition_columns_are_named_through_col_only():
    found = []
    for path in _files(COLUMN_SIDE):
        for k in _column_literals(ast.parse(path.read_text(), str(path))):
            found.append(f"{path.relative_to(ROOT)}:{k.lineno} {k.value!r}")
    assert not found, "use rlinf_user.env.spec.Col (add a name there for a new column):\n" + "\n".join(found)


def test_the_column_lint_sees_a_literal_column():
    code = 'batch["reward"] * 2\ncols = {"obs/state": s, "action": a}\nif "discount" in batch: pass\ncfg.get("reward")'
    assert sorted(k.value for k in _column_literals(ast.parse(code))) == ["action", "discount", "obs/state", "reward"]


def _package_dirs() -> dict[str, Path]:
    """Import prefix -> folder (the top-level folders import as ``rlinf_user.*``)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {k: ROOT / v for k, v in cfg["tool"]["setuptools"]["package-dir"].items()}


def _modules() -> dict[str, Path]:
    out = {}
    for prefix, folder in _package_dirs().items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            out[".".join([prefix, *parts])] = path
    return out


def _part(module: str) -> str:
    """The part of the package a module belongs to: ``rlinf_user.data.replay`` -> data; the
    runtime's roles are parts of their own (``rlinf_user.runtime.learning.learner`` ->
    runtime.learning)."""
    parts = module.split(".")
    return ".".join(parts[1:3]) if parts[1] == "runtime" and len(parts) > 3 else parts[1]


def import_graph() -> dict[str, dict[str, list[str]]]:
    """part -> part it imports -> where (every import statement, function-level ones too)."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for module, path in _modules().items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                targets = [".".join(base + ([node.module] if node.module else []))]
            elif isinstance(node, ast.ImportFrom):
                targets = [node.module or ""]
            else:
                continue
            for t in targets:
                if t.startswith("rlinf_user.") and _part(t) != _part(module):
                    graph[_part(module)][_part(t)].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return graph


def _cycle(graph) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, {})):
            if state.get(w) == 1:
                return stack[stack.index(w) :] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        stack.pop()
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_no_two_parts_of_the_package_import_each_other():
    graph = import_graph()
    cycle = _cycle(graph)
    if cycle:
        where = [f"{a} -> {b}: {', '.join(graph[a][b][:3])}" for a, b in zip(cycle, cycle[1:])]
        raise AssertionError("import cycle " + " -> ".join(cycle) + "\n" + "\n".join(where))


def test_the_layers_point_down():
    """config, evaluation, the edge and the learning core never reach up into the runtime
    that runs them; robots (drivers, cameras, devices) sit below the edge and the envs."""
    graph = import_graph()
    for low in ("config", "evaluation", "edge", "algorithms", "policies", "data", "env", "robots", "sims"):
        up = [p for p in graph.get(low, {}) if p.startswith("runtime")]
        assert not up, f"{low} imports the runtime: {[graph[low][p][:2] for p in up]}"
    for low in ("robots", "env", "sims", "policies", "algorithms", "data"):
        assert "edge" not in graph.get(low, {}), f"{low} imports the edge: {graph[low]['edge'][:3]}"


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b": []}, "b": {}}) is None


def test_no_module_is_longer_than_500_lines():
    paths = [p for p in _modules().values()] + sorted((ROOT / "benchmarks").rglob("*.py"))
    long = [f"{p.relative_to(ROOT)} ({n})" for p in paths if (n := len(p.read_text().splitlines())) > 500]
    assert not long, "split by what each part holds: " + ", ".join(long)
