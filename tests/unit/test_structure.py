"""The layout rules that keep every idea in one room, checked over the package's source:
the runtime never names an algorithm or reads its keys."""

from __future__ import annotations

import ast
from pathlib import Path

from rlinf_user.algorithms.base import ALGORITHMS

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
