"""``--target musa`` / ``--target cuda``: move device-specific code to one vendor.

``"cuda"``/``"cuda:0"`` strings (also ``f"cuda:{rank}"``, ``"cuda:%d" % rank`` and
``"cuda:{}".format(rank)``), ``.cuda()``, the ``torch.cuda.X`` runtime calls with a ``torch.musa``
twin, ``torch.amp.GradScaler()`` without a device (its default is "cuda"), and ``"nccl"`` when the file's
device moves too (and the reverse for ``--target cuda``, which
also drops ``import torch_musa``). A vendor dispatcher that already handles the target
(``if device_type == "cuda": ... elif device_type == "musa": ...``, ``("cuda", "musa")``) is left
alone, or it would become two branches for one vendor. What cannot be moved safely
(``.cuda(rank)``, a ``torch.cuda`` function without a twin, a backend chosen by
``dist.is_nccl_available()``) is reported.
"""

from __future__ import annotations

import re

import libcst as cst

from ampkit.migrate._cst import dotted, last_name, prepend_arg, string_value
from ampkit.migrate._walk import walk
from ampkit.migrate.context import AUTOLOAD_MUSA_VERSION, VENDOR_SWAP
from ampkit.migrate.device_resolve import device_type_of
from ampkit.migrate.rules._amp import scaler_without_device
from ampkit.migrate.rules._device_flow import device_pattern, framework_flow, in_test, is_prose, sink_words
from ampkit.migrate.rules._musa_twins import RENAMED, TWINS
from ampkit.migrate.rules.base import Rule

__all__ = ["DeviceTargetRule", "TWINS"]

_BACKEND = {"musa": ("nccl", "mccl"), "cuda": ("mccl", "nccl")}
# A device string, a template for one or its prefix: "cuda", "cuda:0", "cuda:%d", "cuda:{}", "cuda:{rank}",
# "cuda:{:d}", and "cuda:" (`dev.startswith("cuda:")`, `"cuda:" + str(rank)`).
_TEMPLATE = re.compile(r"(cuda|musa)(:(?:\d+|%\(?\w*\)?[dis]|\{[^{}]*\})?)?")
# Calls whose string arguments are path parts ("csrc", "cuda", "*.cu"), not devices.
_PATH_CALLS = frozenset({"join", "glob", "iglob", "Path", "PurePath"})
# Keywords whose string value is a name (an argparse flag, a destination), not a device.
_NAME_KEYWORDS = frozenset({"name", "dest", "prefix"})
# Device counting that sees no MUSA card: (word in a string, what to use on MUSA).
_COUNTING = (("CUDA_VISIBLE_DEVICES", "MUSA_VISIBLE_DEVICES"), ("nvidia-smi", "mthreads-gmi"))
_LIGHTNING_FIX = ("Lightning accepts only its registered accelerator names (auto, cpu, cuda, gpu, mps, tpu): "
                  "pass an Accelerator instance for MUSA, e.g. Fabric(accelerator=MUSAAccelerator()) with "
                  "class MUSAAccelerator(lightning.fabric.accelerators.Accelerator) returning torch.device(\"musa\"), "
                  "or drive the MUSA card from plain PyTorch")


class DeviceTargetRule(Rule):
    codes = ()
    # both vendors (a dispatcher is one that names both), the backends, what counts devices, framework names
    keep = ("*cuda*", "*musa*", "*CUDA*", "*MUSA*", "*nccl*", "*mccl*", "*GradScaler", "*nvidia-smi*", "gpu")

    @classmethod
    def keep_words(cls, code: str) -> tuple[str, ...]:
        return sink_words(code)  # `L.Fabric(accelerator=accel)`: the flow reads where `accel` goes

    @classmethod
    def may_match(cls, text: str, target: str) -> bool:
        if target not in VENDOR_SWAP:
            return False
        src = VENDOR_SWAP[target][0]
        return src in text or _BACKEND[target][0] in text or (target == "musa" and (
            "GradScaler" in text or any(word in text for word, _ in _COUNTING)))

    def visit_Module(self, node: cst.Module) -> None:
        self._seen_vendors: dict[cst.CSTNode, frozenset[str]] = {}
        self.src, self.dst = VENDOR_SWAP[self.ctx.target]
        self.backend = _BACKEND[self.ctx.target]
        self._moved = False  # a device moved: the collective backend may follow
        self._backends: list[cst.SimpleString] = []
        self._flow = framework_flow(self.ctx)
        self._pattern = device_pattern(self.src)

    def replace(self, node: cst.CSTNode, fn) -> None:
        # a statement whose string reaches a framework's name stays whole: no half of it moves
        if self._flow is None or not self._flow.frozen or not self._in_frozen(node):
            super().replace(node, fn)

    def _in_frozen(self, node: cst.CSTNode) -> bool:
        while node is not None and not isinstance(node, (cst.SimpleStatementLine, cst.Param, cst.Module)):
            node = self.ctx.parent(node)
        return node in self._flow.frozen

    def leave_Module(self, node: cst.Module) -> None:
        self._import_torch_musa(node)
        old, new = self.backend
        for string in self._backends:
            if self._moved:
                self.replace(string, lambda u: u.with_changes(value=f"{u.prefix}{u.quote}{new}{u.quote}"))
            else:
                self.report(string, "deprecated-amp-api",
                            f'"{old}" was not moved to "{new}": nothing in this file puts the model on a '
                            f"{self.dst} device, and the backend must match the device it runs on.",
                            f'backend = "{new}" if device.type == "{self.dst}" else "gloo"', kind="backend")

    def _import_torch_musa(self, module: cst.Module) -> None:
        """torch_musa before 2.1 does not load itself: a file that now uses "musa" needs ``import torch_musa``
        (after its first ``import torch``) or the device does not exist (``--musa-version``)."""
        if self.dst != "musa" or not self._moved or self.ctx.musa_version >= AUTOLOAD_MUSA_VERSION:
            return
        if re.search(r"^\s*import\s+torch_musa\b", self.ctx.source, re.MULTILINE):
            return
        for st in module.body:
            if isinstance(st, cst.SimpleStatementLine) and any(
                    isinstance(s, cst.Import) and any((dotted(a.name) or "").split(".")[0] == "torch" for a in s.names)
                    for s in st.body):
                line = cst.parse_statement("import torch_musa  # torch_musa < 2.1 does not load itself\n")
                self.replace(st, lambda u: cst.FlattenSentinel([u, line]))
                return

    # Dispatchers that already handle both vendors: not a line of them changes.
    def _vendors(self, *nodes: cst.CSTNode) -> set[str]:
        found: set[str] = set()
        for n in nodes:  # an if/elif chain asks again for each link: each node is walked once
            if n not in self._seen_vendors:
                self._seen_vendors[n] = self._walk_vendors(n)
            found |= self._seen_vendors[n]
        return found

    def _walk_vendors(self, node: cst.CSTNode) -> frozenset[str]:
        found: set[str] = set()
        ctx = self.ctx

        class _Vendors(cst.CSTVisitor):
            def visit_SimpleString(self, n: cst.SimpleString) -> None:
                found.add(device_type_of(string_value(n)) or "")

            def visit_Attribute(self, n: cst.Attribute) -> None:  # torch.cuda / torch.musa
                if ctx.is_torch(n.value):
                    found.add(n.attr.value)

        walk(node, [_Vendors()])
        return frozenset(found)

    def _handles_both(self, *nodes: cst.CSTNode) -> bool:
        return {self.src, self.dst} <= self._vendors(*nodes)

    def _dispatches(self, tests: list[cst.CSTNode], choices: list[cst.CSTNode]) -> bool:
        """A conditional that serves both vendors. Not so when the test asks about the old vendor and
        the branches name only the new one (a MUSA tutorial's ``'musa' if torch.cuda.is_available()
        else 'cpu'``, which trains on the CPU): that test is a half-done port, and moves."""
        in_tests, in_choices = self._vendors(*tests), self._vendors(*choices)
        if self.src in in_tests and self.src not in in_choices and self.dst in in_choices:
            return False
        return {self.src, self.dst} <= in_tests | in_choices

    def visit_If(self, node: cst.If) -> bool:
        # The whole if / elif chain: its tests and the simple statements directly in its branches
        # (`DEVICE = "cuda"` / `DEVICE = "musa"`), not blocks nested deeper.
        tests: list[cst.CSTNode] = []
        choices: list[cst.CSTNode] = []
        branch: cst.CSTNode | None = node
        while branch is not None:
            if isinstance(branch, cst.If):
                tests.append(branch.test)
            body = branch.body
            choices.extend(st for st in getattr(body, "body", ()) if isinstance(st, cst.SimpleStatementLine))
            branch = branch.orelse if isinstance(branch, cst.If) else None
        return not self._dispatches(tests, choices)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        # def cuda(self) next to def musa(self), is_cuda_available next to is_musa_available:
        # code that serves both vendors already; moving one makes two for the same vendor.
        name = node.name.value
        if self.src not in name.split("_"):
            return True
        twin = "_".join(self.dst if part == self.src else part for part in name.split("_"))
        siblings = getattr(self.ctx.parent(node), "body", ())
        return not any(isinstance(st, cst.FunctionDef) and st.name.value == twin for st in siblings)

    def visit_IfExp(self, node: cst.IfExp) -> bool:
        if "nccl_available" in self.ctx.code(node.test) or "mccl_available" in self.ctx.code(node.test):
            self.report(node, "deprecated-amp-api",
                        f"a backend chosen by `{self.ctx.code(node.test)}` was left as is: that test says nothing "
                        f"about {self.dst}; choose the backend from the device you run on.",
                        f'backend = "{self.backend[1]}" if device.type == "{self.dst}" else "gloo"',
                        kind="vendor check")
            return False
        return not self._dispatches([node.test], [node.body, node.orelse])

    def visit_Tuple(self, node: cst.Tuple) -> bool:
        return not self._handles_both(node)

    def visit_List(self, node: cst.List) -> bool:
        return not self._handles_both(node)

    def visit_Set(self, node: cst.Set) -> bool:
        return not self._handles_both(node)

    def visit_Dict(self, node: cst.Dict) -> bool:
        return not self._handles_both(node)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value is None or self._string_statement(node) or is_prose(self.ctx, node):
            return
        if self.dst == "musa" and self._counts_devices(node, value):
            return
        m = _TEMPLATE.fullmatch(value)
        if (m and m.group(1) == self.src or value == "gpu") and (
                self._framework_name(node, value) or self._reaches_framework(node, value)):
            return
        if m and m.group(1) == self.src and self.ctx.in_fallback(node):
            return  # a test in code for old torch (torch<1.10 has no torch.autocast): left alone
        if m and m.group(1) == self.src and not m.group(2) and self._names_something(node):
            return
        if m and m.group(1) == self.src:
            new = self.dst + value[len(self.src):]
            self._moved = True
            self.replace(node, lambda u: u.with_changes(value=f"{u.prefix}{u.quote}{new}{u.quote}"))
        elif value == self.backend[0]:
            self._backends.append(node)
        elif not m and self._pattern.fullmatch(value) and in_test(self.ctx, node) and not self.ctx.in_fallback(node):
            self.report(node, "deprecated-amp-api",
                        f"could not port: device test. {value!r} tests a device's text for {self.src}, and it cannot "
                        f"be moved as written: a {self.dst} device fails it while the rest of the flow moves. "
                        "Left as is.",
                        f'device.type == "{self.dst}"  # test the device type, not its text', kind="device test")

    def _string_statement(self, node: cst.SimpleString) -> bool:
        """A docstring, or any string standing as a statement: prose, not code (the AMP recipe's
        "Run ``nvidia-smi`` to display your GPU's architecture" counts no devices)."""
        parent = self.ctx.parent(node)
        while isinstance(parent, cst.ConcatenatedString):
            parent = self.ctx.parent(parent)
        return isinstance(parent, cst.Expr)

    def _framework_name(self, node: cst.SimpleString, value: str) -> bool:
        """``accelerator="cuda"`` (or ``"gpu"``) for Lightning's ``Fabric``/``Trainer``: a framework's
        name, not a torch device; ``"musa"`` there raises. Reported, left as is."""
        parent = self.ctx.parent(node)
        if not (isinstance(parent, cst.Arg) and parent.keyword is not None and parent.keyword.value == "accelerator"):
            return False
        if self.dst == "musa":
            call = self.ctx.parent(parent)
            callee = last_name(call.func) if isinstance(call, cst.Call) else None
            self.report(node, "deprecated-amp-api",
                        f'could not port: framework name. accelerator="{value}" is {callee or "a framework"}\'s '
                        f'name, not a torch device; "musa" is not one of its names and would raise. Left as is.',
                        _LIGHTNING_FIX, kind="framework name")
        return True

    def _reaches_framework(self, node: cst.SimpleString, value: str) -> bool:
        """A string that reaches ``accelerator=`` through a variable, a parameter or a setting named for it
        (:mod:`._device_flow`): reported, and its statement left whole."""
        use = self._flow.uses.get(node) if self._flow is not None else None
        if use is None:
            return False
        if self.dst == "musa":
            if not use.setting:
                how = f"reaches accelerator= at line {self.ctx.line(use.node)} through `{use.via}`"
            else:
                how = f"sets `{use.via}`" + ("" if use.via == "accelerator" else ", which reaches accelerator=")
            self.report(node, "deprecated-amp-api",
                        f'could not port: framework name. "{value}" {how}, so it is a framework\'s accelerator name '
                        '(Lightning), not a torch device; "musa" is not one of its names and would raise. The line '
                        'is left as is.',
                        _LIGHTNING_FIX, kind="framework name")
        return True

    def _counts_devices(self, node: cst.SimpleString, value: str) -> bool:
        for word, musa in _COUNTING:
            if word in value:
                self.report(node, "deprecated-amp-api",
                            f"could not port: device counting. {word} knows nothing of MUSA cards, so this "
                            "counts or picks no device there. Left as is.",
                            f"{musa} on MUSA; count the cards with torch.musa.device_count()",
                            kind="device counting")
                return True
        return False

    def _names_something(self, node: cst.SimpleString) -> bool:
        """A bare "cuda" that is a name rather than a device (DeepLearningExamples): a folder in
        ``os.path.join(dir, "cuda", "*.cu")``, an argparse flag ``name="cuda"`` read back as
        ``args.cuda``, or a key of a keyword dict ``{"epochs": 3, "cuda": True}`` passed as ``**kw``."""
        parent = self.ctx.parent(node)
        if isinstance(parent, cst.Arg):
            if parent.keyword is not None:
                return parent.keyword.value in _NAME_KEYWORDS
            call = self.ctx.parent(parent)
            return isinstance(call, cst.Call) and last_name(call.func) in _PATH_CALLS
        if isinstance(parent, cst.DictElement) and parent.key is node:
            keys = [string_value(e.key) for e in getattr(self.ctx.parent(parent), "elements", ())
                    if isinstance(e, cst.DictElement)]
            return any(k is not None and device_type_of(k) is None for k in keys)
        return False

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        # f"cuda:{rank}": the text before the first placeholder names the device.
        parts = node.parts
        if len(parts) >= 2 and not is_prose(self.ctx, node) and isinstance(parts[0], cst.FormattedStringText) and \
                parts[0].value == f"{self.src}:" and isinstance(parts[1], cst.FormattedStringExpression):
            self._moved = True
            self.replace(parts[0], lambda u: u.with_changes(value=f"{self.dst}:"))

    def visit_Attribute(self, node: cst.Attribute) -> None:
        # torch.cuda.synchronize -> torch.musa.synchronize
        inner = node.value
        if node.attr.value == f"is_{self.src}" and not self.ctx.is_torch(inner):
            self._vendor_test(node)
            return
        if isinstance(inner, cst.Attribute) and inner.attr.value == "version" and self.ctx.is_torch(inner.value) \
                and node.attr.value == self.src and not self.ctx.in_fallback(node):
            if is_prose(self.ctx, node) or isinstance(self.ctx.parent(node), cst.DictElement):
                return  # printed, logged or recorded (an environment report): no path is chosen by it
            self.report(node, "deprecated-amp-api",
                        f"could not port: vendor check. torch.version.{self.src} is None on a {self.dst} build, so a "
                        f"test on it takes the non-GPU path there. Left as is.",
                        f"torch.version.{self.dst}  # or test the device you run on: device.type == \"{self.dst}\"",
                        kind="vendor check")
            return
        if isinstance(inner, cst.Attribute) and inner.attr.value == "backends" and self.ctx.is_torch(inner.value) \
                and node.attr.value == self.src and not self.ctx.in_fallback(node):
            self._backend_switch(node)
            return
        if not (isinstance(inner, cst.Attribute) and inner.attr.value == self.src
                and self.ctx.is_torch(inner.value)) or self.ctx.in_fallback(node):
            return
        renamed = RENAMED if self.dst == "musa" else {v: k for k, v in RENAMED.items()}
        name = node.attr.value
        if name in TWINS or name in renamed:
            self._moved = True
            new = renamed.get(name, name)
            self.replace(node, lambda u: u.with_changes(value=u.value.with_changes(attr=cst.Name(self.dst)),
                                                        attr=u.attr.with_changes(value=new)))
        elif name != "amp":  # the amp rules handle torch.cuda.amp
            self.report(node, "deprecated-amp-api",
                        f"could not port: `{dotted(node)}` has no torch.{self.dst} twin (checked in torch_musa's "
                        "source); left as is.",
                        f"check torch.{self.dst} for an equivalent, or use the device-generic torch API",
                        kind="no twin")

    def _backend_switch(self, node: cst.Attribute) -> None:
        """``torch.backends.cuda.matmul.allow_tf32 = True`` (nanoGPT): a switch for CUDA's own kernels
        (cuBLAS, flash attention, cuFFT). It exists on a MUSA build too and does nothing for a MUSA card,
        whose switches are ``torch.backends.mudnn.allow_tf32`` and, from torch_musa 2.9,
        ``torch.backends.musa.matmul.allow_tf32`` (MUSA.md): reported, left as is."""
        whole: cst.CSTNode = node
        parent = self.ctx.parent(whole)
        while isinstance(parent, cst.Attribute) and parent.value is whole:
            whole, parent = parent, self.ctx.parent(parent)
        name = dotted(whole) or f"torch.backends.{self.src}"
        tf32 = name.endswith("matmul.allow_tf32")
        if self.dst == "musa":
            fix = ("torch.backends.mudnn.allow_tf32 = True  # torch_musa before 2.9\n"
                   "torch.backends.musa.matmul.allow_tf32 = True  # torch_musa 2.9 and later") if tf32 else \
                f"drop it on MUSA, or keep it for CUDA only: if device.type == \"{self.src}\": {name} = ..."
        else:
            fix = "torch.backends.cuda.matmul.allow_tf32 = True" if tf32 else \
                f"drop it on CUDA, or keep it for MUSA only: if device.type == \"{self.src}\": {name} = ..."
        own = "torch_musa has its own switches" if self.dst == "musa" else "a CUDA build reads torch.backends.cuda"
        self.report(node, "deprecated-amp-api",
                    f"could not port: `{name}` is a switch for {self.src.upper()}'s own kernels and has no "
                    f"torch.backends.{self.dst} twin; {own}. Left as is.", fix, kind="no twin")

    def _vendor_test(self, node: cst.Attribute) -> None:
        """``x.is_cuda`` is False for a MUSA tensor: the GPU path would never be taken. torch_musa gives
        tensors ``is_musa`` (torch_musa/core/tensor_attrs.py), so the test moves to it."""
        if self.ctx.in_fallback(node):
            return
        self._moved = True
        self.replace(node, lambda u: u.with_changes(attr=cst.Name(f"is_{self.dst}")))

    def visit_Call(self, node: cst.Call) -> None:
        # A scaler given no device is a "cuda" scaler (torch_musa replaces FSDP's ShardedGradScaler itself).
        if self.dst == "musa" and scaler_without_device(self, node):
            self._moved = True
            device = self.ctx.literal(self.dst)
            self.replace(node, lambda u: prepend_arg(u, cst.Arg(cst.SimpleString(device))))
            return
        if self.dst == "musa" and _fairscale_scaler(self, node):
            self.report(node, "deprecated-amp-api",
                        "could not port: fairscale's `ShardedGradScaler` is a `torch.cuda.amp.GradScaler` and takes "
                        "no device, so it scales on CUDA only; torch_musa replaces torch's FSDP `ShardedGradScaler`, "
                        "not fairscale's. Left as is.",
                        "from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler\n"
                        "scaler = ShardedGradScaler(device=\"musa\")  # or torch.amp.GradScaler(\"musa\") under FSDP2",
                        kind="no twin")
            return
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == self.src) \
                or self.ctx.is_torch(func.value):
            return
        positional = [a for a in node.args if a.keyword is None]
        device = self.ctx.literal(self.dst)
        if not positional and not any(a.keyword.value == "device" for a in node.args):
            self._moved = True
            self.replace(node, lambda u: prepend_arg(u.with_changes(func=u.func.with_changes(attr=cst.Name("to"))),
                                                     cst.Arg(cst.SimpleString(device))))
        elif len(positional) == 1 and isinstance(positional[0].value, cst.Integer) and not positional[0].star:
            index = positional[0].value.value
            literal = cst.SimpleString(self.ctx.literal(f"{self.dst}:{index}"))
            self._moved = True
            self.replace(node, lambda u: u.with_changes(
                func=u.func.with_changes(attr=cst.Name("to")),
                args=[u.args[0].with_changes(value=literal), *u.args[1:]]))
        else:
            self.report(node, "deprecated-amp-api",
                        f"`.{self.src}(...)` with a device argument was not rewritten for --target {self.dst}: "
                        "the argument may be an index or a device.",
                        f'.to(torch.device("{self.dst}", index))  # index: int', kind="device index")

    def leave_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if self.dst != "cuda" or len(node.body) != 1 or not isinstance(node.body[0], cst.Import):
            return
        names = node.body[0].names
        keep = [a for a in names if dotted(a.name) != "torch_musa" or a.asname is not None]
        if len(keep) == len(names):
            return
        if not keep:  # CUDA machines have no torch_musa: the import would fail there
            self.replace(node, lambda u: cst.RemovalSentinel.REMOVE)
            return

        def drop(u: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
            imp = u.body[0]
            kept = [a for a in imp.names if dotted(a.name) != "torch_musa" or a.asname is not None]
            kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return u.with_changes(body=[imp.with_changes(names=kept)])

        self.replace(node, drop)


def _fairscale_scaler(rule: Rule, node: cst.Call) -> bool:
    """``ShardedGradScaler(...)`` imported from fairscale (``fairscale.optim.grad_scaler``)."""
    if last_name(node.func) != "ShardedGradScaler":
        return False
    return any(q.startswith("fairscale.") for q in rule.ctx.qnames(node.func))
