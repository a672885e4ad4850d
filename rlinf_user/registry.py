"""One registry style for every pluggable part (policies, algorithms, env backends).

A registry maps a name to ``"module:attribute"``; the module is imported only when the
name is asked for, so registering costs nothing at import time and optional
dependencies stay optional.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


class UnknownNameError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


class Registry:
    def __init__(self, kind: str, entries: Mapping[str, str]):
        self.kind = kind
        self._entries = dict(entries)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def path(self, name: str) -> str:
        if name not in self._entries:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; available: {', '.join(self.names())}")
        return self._entries[name]

    def get(self, name: str) -> Any:
        module, _, attr = self.path(name).partition(":")
        return getattr(importlib.import_module(module), attr)
