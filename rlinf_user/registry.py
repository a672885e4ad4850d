"""One registry style for every pluggable part: algorithms, policies, env backends,
robots, cameras, image encoders, teleop devices, grippers and edge backends.

A registry maps a name to ``"module:attribute"``; the module is imported only when the
name is asked for, so registering costs nothing at import time and optional dependencies
stay optional. A registry with an ``entry_points`` group also takes the entries other
installed packages declare there (``[project.entry-points."rlinf_user.algorithms"]``
``iql = "my_lab.iql:IQL"``), so a lab ships its algorithm or robot as its own package,
without forking. A built-in name wins over a plugin's of the same name (with a warning).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from importlib.metadata import entry_points as _installed_entry_points
from typing import Any

log = logging.getLogger(__name__)

#: every registry's entry-point group, for ``rlinf-user doctor`` and the docs
ENTRY_POINT_GROUPS: dict[str, str] = {}


class UnknownNameError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


class Registry:
    def __init__(self, kind: str, entries: Mapping[str, str], entry_points: str | None = None):
        self.kind = kind
        self._builtin = dict(entries)
        self._group = entry_points
        self._plugins: dict[str, str] | None = None
        if entry_points:
            ENTRY_POINT_GROUPS[kind] = entry_points

    def _entries(self) -> dict[str, str]:
        if self._group is None:
            return self._builtin
        if self._plugins is None:  # read once, on the first lookup (not at import)
            self._plugins = {}
            for ep in _installed_entry_points(group=self._group):
                if ep.name in self._builtin:
                    log.warning("%s plugin %r (%s) shadows a built-in one: ignored", self.kind, ep.name, ep.value)
                    continue
                self._plugins[ep.name] = ep.value
        return {**self._plugins, **self._builtin}

    def refresh(self) -> None:
        """Read the installed entry points again (after installing a plugin in-process)."""
        self._plugins = None

    def names(self) -> list[str]:
        return sorted(self._entries())

    def __contains__(self, name: object) -> bool:
        return name in self._entries()

    def path(self, name: str) -> str:
        entries = self._entries()
        if name not in entries:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; available: {', '.join(sorted(entries))}")
        return entries[name]

    def get(self, name: str) -> Any:
        module, _, attr = self.path(name).partition(":")
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj
