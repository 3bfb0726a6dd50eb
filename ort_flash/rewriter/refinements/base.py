"""The base of the rules that improve an ``ort_flash.FlashAttention`` node a fusion rule made.

A refinement matches one FlashAttention node (and what feeds or follows it), proves that a
cheaper form computes the same function, and re-emits the node with other inputs or attributes,
keeping its name so that the report entry follows it. ``applied`` lists (node, report fields
changed); ``declined`` the reason per node where the check failed.

A refinement built with ``present=True`` matches a node whose ``present_key`` /
``present_value`` outputs are in use (a KV-cache attention, see ``kv_cache``) and re-emits it
with those outputs; with ``present=False`` (the default) the node's Y must be its only output
in use.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_flash.rewriter import flash_op
from ort_flash.rewriter.onnxscript_api import MatchFailureError, as_failure

INPUTS = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")


class Refinement(pattern.RewriteRuleClassBase):
    family = "refinement"
    has_present_variant = False  # rules() also gives a present=True instance

    def __init__(self, variant: str = "", *, present: bool = False) -> None:
        variant = ",".join(v for v in (variant, "present" if present else "") if v)
        self.variant = variant
        self.present = present
        super().__init__(name=f"{self.family}[{variant}]" if variant else self.family)
        self.applied: list[tuple[str, dict]] = []
        self.declined: dict[str, str] = {}
        self._plan: dict | None = None

    def check(self, context, **bindings):
        node = self.flash_node(context)
        try:
            if node is None:
                raise MatchFailureError("no FlashAttention node in the match")
            has_present = len(node.outputs) == 3
            if self.present != has_present and (self.present or self.has_present_variant):
                # the family's other variant handles this node: not a decline
                return pattern.MatchResult().fail("the other variant matches this node", node)
            if has_present and not self.present:
                raise MatchFailureError("the node has present_key / present_value outputs (a KV "
                                        "cache), which this rule does not handle")
            used = [i for i, o in enumerate(node.outputs) if o.uses() or o.is_graph_output()]
            if any(i > (2 if self.present else 0) for i in used):
                raise MatchFailureError("the node's present / softmax_lse outputs are used")
            self._plan = self.analyze(context, node, **bindings)
        except Exception as e:  # noqa: BLE001 - a bug in a check must decline, not crash
            e = as_failure(e)
            if node is not None:
                self.declined[node.name] = e.reason
            return pattern.MatchResult().fail(e.reason, node)
        if node is not None:
            self.declined.pop(node.name, None)
        return pattern.MatchResult()

    def flash_node(self, context) -> ir.Node | None:
        return next((n for n in context.nodes
                     if n.domain == flash_op.DOMAIN and n.op_type == flash_op.OP_TYPE), None)

    def analyze(self, context, node: ir.Node, **bindings) -> dict:
        raise NotImplementedError

    def emit(self, op, node: ir.Node, inputs: dict[str, ir.Value | None], attrs: dict,
             report: dict, output: ir.Value | None = None,
             presents: tuple[ir.Value, ir.Value] | None = None):
        """``node`` again with ``inputs`` / ``attrs`` replacing its own (None removes one); the
        new Y takes the type and shape of ``output`` (default: the node's Y). With ``presents``
        (or for a node that has them) it also has the present_key / present_value outputs,
        typed like those values, and returns (Y, present_key, present_value)."""
        values = list(node.inputs) + [None] * (len(INPUTS) - len(node.inputs))
        for name, value in inputs.items():
            values[INPUTS.index(name)] = value
        while values and values[-1] is None:
            values.pop()
        merged = {k: a.value for k, a in node.attributes.items()}
        merged.update(attrs)
        merged = {k: v for k, v in merged.items() if v is not None}
        if presents is None and len(node.outputs) == 3:
            presents = (node.outputs[1], node.outputs[2])
        outputs = 3 if presents is not None else 1
        new = op.FlashAttention(*values, **merged, _domain=flash_op.DOMAIN,
                                _version=flash_op.VERSION, _outputs=outputs)
        new = list(new) if outputs == 3 else [new]
        new[0].producer().name = node.name
        for value, like in zip(new, (output or node.outputs[0], *(presents or ()))):
            value.shape, value.type = like.shape, like.type
        self.applied.append((node.name, report))
        return tuple(new) if outputs == 3 else new[0]


def flash_pattern(op, q, k, v, *rest, present: bool = False, **kwargs):
    """A FlashAttention node: its Y, or (present=True) its (Y, present_key, present_value)."""
    return op.FlashAttention(q, k, v, *rest, _domain=flash_op.DOMAIN, _allow_other_inputs=True,
                             _allow_other_attributes=True, _outputs=3 if present else 1, **kwargs)
