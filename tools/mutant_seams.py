"""How a mutant breaks the code: a patch of a named seam (a method, a function, a module attribute),
applied right after the seam's module has been executed, in every process that imports it.

``tools/mutant_patches.py`` names the mutants (with ``mutant_security.py``'s and ``mutant_gpu.py``'s,
which build their tables from ``attr`` and ``on`` here too); this module only applies them.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from typing import Any, Callable

Patch = tuple[str, Callable[[], None]]  # (the module it patches, the patch), applied once that module is loaded


def setter(module: str, name: str, value: Callable[..., Any]) -> Callable[[], None]:
    def apply() -> None:
        owner: Any = importlib.import_module(module)
        *path, attribute = name.split(".")
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, attribute, value)

    return apply


def on(module: str, fn: Callable[[], None]) -> list[Patch]:
    return [(module, fn)]


def attr(module: str, name: str, value: Any) -> list[Patch]:
    return [(module, setter(module, name, value))]


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs each patch right after its module has been executed (before anyone imports from it)."""

    def __init__(self, patches: list[Patch]) -> None:
        self.pending = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if not any(module == name for module, _ in self.pending):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                run_module = spec.loader.exec_module

                def exec_module(module: Any, run_module: Any = run_module, name: str = name) -> None:
                    run_module(module)
                    self.loaded(name)

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None

    def loaded(self, name: str) -> None:
        for module, patch in [p for p in self.pending if p[0] == name]:
            self.pending.remove((module, patch))
            patch()


def install(patches: list[Patch]) -> None:
    """Apply each patch now if its module is loaded, else as soon as it is."""
    patches = list(patches)
    hook = _AfterImport([p for p in patches if p[0] not in sys.modules])
    for module, patch in patches:
        if module in sys.modules:
            patch()
    sys.meta_path.insert(0, hook)
