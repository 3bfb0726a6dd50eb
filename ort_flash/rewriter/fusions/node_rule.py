"""The base of the fusions that map one attention node of another op set onto ort_flash's
(``onnx_attention``, ``ms_multihead_attention``, ``group_query_attention``): the report's
records (``failures``, ``fused``) and a ``check`` that turns ``analyze``'s decline, or any bug in
it, into the reason the report gives for the node."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_flash.rewriter.onnxscript_api import as_failure
from ort_flash.rewriter.report import FusedSubgraph


class NodeRule(pattern.RewriteRuleClassBase):
    family = ""

    def __init__(self, variant: str = "") -> None:
        self.variant = variant
        super().__init__(name=f"{self.family}[{variant}]" if variant else self.family)
        self.failures: dict[ir.Node, tuple[int, str]] = {}
        self.fused: list[FusedSubgraph] = []
        self._plan: dict | None = None

    def analyze(self, context, **bindings) -> dict:
        """The plan ``rewrite`` follows for ``context.root``, or MatchFailureError with the reason."""
        raise NotImplementedError

    def reports(self, reason: str) -> bool:
        """Whether a decline is the node's reason in the report (a variant that only exists to
        name a reason may decline the rest silently)."""
        return True

    def check(self, context, **bindings):
        node = context.root
        try:
            self._plan = self.analyze(context, **bindings)
        except Exception as e:  # noqa: BLE001 - a bug in a check must decline, not crash
            e = as_failure(e)
            if self.reports(e.reason):
                self.failures[node] = (1, e.reason)
            return pattern.MatchResult().fail(e.reason, node)
        return pattern.MatchResult()
