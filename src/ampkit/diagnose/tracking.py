"""Where things happen in the user's code: user frames (file:line) and module dotted paths.

:class:`UserCode` decides which stack frames belong to the user's script (its folder, not torch,
not ampkit). :class:`ModuleTracker` finds the top-level modules of the script at their first
forward (the module called while no other module is running) and names every submodule by its
dotted path, prefixed by the variable that holds the root when the user's code has one
(``model.encoder.2``), else by the root's class name.
"""

from __future__ import annotations

import os
import sys
import weakref
from types import FrameType

import torch

__all__ = ["UserCode", "ModuleTracker", "tensor_leaves", "strip_compile_prefix", "short_path", "frame_where", "is_ampkit_file"]

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_AMPKIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def is_ampkit_file(filename: str) -> bool:
    """A file of ampkit itself (its frames are never the user's)."""
    return os.path.abspath(filename).startswith(_AMPKIT_DIR)


def tensor_leaves(obj) -> list[torch.Tensor]:
    """Floating-point tensors in a nested structure of tuples, lists and dicts (module in/outputs)."""
    out: list[torch.Tensor] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.is_floating_point() and item.device.type != "meta":
                out.append(item)
        elif isinstance(item, (tuple, list)):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return out


class UserCode:
    """Recognises the user's frames: files under the script's folder, outside torch and ampkit."""

    def __init__(self, script_dir: str) -> None:
        self.script_dir = os.path.abspath(script_dir) + os.sep
        self._cache: dict[str, bool] = {}
        self._short: dict[str, str] = {}  # a run's where() is called per module call: one getcwd per file

    def is_user_file(self, filename: str) -> bool:
        hit = self._cache.get(filename)
        if hit is None:
            path = os.path.abspath(filename)
            hit = (path.startswith(self.script_dir) and not path.startswith(_TORCH_DIR)
                   and not path.startswith(_AMPKIT_DIR) and "site-packages" not in path[len(self.script_dir):])
            self._cache[filename] = hit
        return hit

    def frame(self, depth: int = 1) -> FrameType | None:
        """The innermost user frame above the caller, or None."""
        try:
            f: FrameType | None = sys._getframe(depth + 1)
        except ValueError:
            return None
        while f is not None:
            if self.is_user_file(f.f_code.co_filename):
                return f
            f = f.f_back
        return None

    def where(self, depth: int = 1) -> str:
        """``file:line`` of the innermost user frame (relative to the current folder when shorter)."""
        f = self.frame(depth + 1)
        if f is None:
            return "(not in the script's code)"
        name = self._short.get(f.f_code.co_filename)
        if name is None:
            name = self._short[f.f_code.co_filename] = short_path(f.f_code.co_filename)
        return f"{name}:{f.f_lineno}"

    def caller_is_user(self, depth: int = 1) -> FrameType | None:
        """The frame ``depth`` levels above the caller when it is user code (a direct call), else None."""
        try:
            f = sys._getframe(depth + 1)
        except ValueError:
            return None
        return f if self.is_user_file(f.f_code.co_filename) else None


def frame_where(f: FrameType) -> str:
    return f"{short_path(f.f_code.co_filename)}:{f.f_lineno}"


def short_path(path: str) -> str:
    """How every ``where`` names a file: relative to the current folder when the file is inside it,
    else absolute (one form for script errors and findings alike)."""
    full = os.path.abspath(path)
    cwd = os.getcwd() + os.sep
    return full[len(cwd):] if full.startswith(cwd) else full


def strip_compile_prefix(name: str) -> str:
    """``_orig_mod.encoder.2`` -> ``encoder.2``: the wrapper ``torch.compile`` adds is not the user's name."""
    return ".".join(part for part in name.split(".") if part != "_orig_mod")


class ModuleTracker:
    """Dotted paths for modules and parameters, learned from the roots seen at forward time.

    Call :meth:`enter` from a global forward pre-hook and :meth:`leave` from a global forward hook
    registered with ``always_call=True`` (so an exception cannot leave the depth counter high).
    """

    def __init__(self, user: UserCode) -> None:
        self.user = user
        self.depth = 0
        self._names: dict[int, tuple[weakref.ref, str]] = {}
        self._rel: dict[int, tuple[weakref.ref, str]] = {}
        self._by_full: dict[str, str] = {}
        self._params: dict[int, tuple[weakref.ref, str]] = {}
        self._roots: list[weakref.ref] = []

    def enter(self, module: torch.nn.Module) -> bool:
        """Count a module entering forward; returns True when it is a root (no module running)."""
        root = self.depth == 0
        self.depth += 1
        if root and self._lookup(self._names, module) is None:
            self._register_root(module)
        return root

    def leave(self) -> None:
        self.depth = max(0, self.depth - 1)

    def roots(self) -> list[torch.nn.Module]:
        return [m for m in (r() for r in self._roots) if m is not None]

    def name(self, module: torch.nn.Module) -> str:
        name = self._lookup(self._names, module)
        return name if name is not None else f"<{type(module).__name__}>"

    def relative(self, full_name: str) -> str:
        """``model.encoder.2`` -> ``encoder.2`` for a name this tracker gave out (else unchanged)."""
        return self._by_full.get(full_name, full_name)

    def relative_name(self, module: torch.nn.Module) -> str:
        """The module's qualified name inside its root model (what ``named_modules`` and
        ``fp32_modules`` call it: ``encoder.2``), or the full name for a root."""
        hit = self._rel.get(id(module))
        if hit is not None and hit[0]() is module:
            return hit[1]
        return self.name(module)

    def param_name(self, param: torch.Tensor) -> str:
        name = self._lookup(self._params, param)
        return name if name is not None else f"<parameter {tuple(param.shape)}>"

    def describe(self, module: torch.nn.Module) -> str:
        """``model.fc2 (Linear)``."""
        return f"{self.name(module)} ({type(module).__name__})"

    @staticmethod
    def _lookup(table: dict, obj) -> str | None:
        hit = table.get(id(obj))
        if hit is None or hit[0]() is not obj:
            return None
        return hit[1]

    def add_root(self, root: torch.nn.Module, name: str | None = None) -> None:
        """Name ``root`` and its submodules now (``name`` defaults to the user's variable or class name)."""
        self._register_root(root, name)

    def _register_root(self, root: torch.nn.Module, name: str | None = None) -> None:
        orig = getattr(root, "_orig_mod", None)  # torch.compile(model): the user's own variable names it
        base = (name or (self._variable_name(orig) if isinstance(orig, torch.nn.Module) else None)
                or self._variable_name(root) or type(root).__name__)
        self._roots.append(weakref.ref(root))
        for name, sub in root.named_modules():
            name = strip_compile_prefix(name)
            if self._lookup(self._names, sub) is None:
                self._names[id(sub)] = (weakref.ref(sub), f"{base}.{name}" if name else base)
                if name:
                    self._rel[id(sub)] = (weakref.ref(sub), name)
                    self._by_full[f"{base}.{name}"] = name
        for name, p in root.named_parameters():
            if self._lookup(self._params, p) is None:
                self._params[id(p)] = (weakref.ref(p), f"{base}.{strip_compile_prefix(name)}")

    def _variable_name(self, module: torch.nn.Module) -> str | None:
        """The name the user's code binds the root to (``model``), looked up in user frames."""
        try:
            f: FrameType | None = sys._getframe(1)
        except ValueError:
            return None
        while f is not None:
            if self.user.is_user_file(f.f_code.co_filename):
                for scope in (f.f_locals, f.f_globals):
                    for key, value in list(scope.items()):
                        if value is module and not key.startswith("_") and key != "self":
                            return key
            f = f.f_back
        return None
