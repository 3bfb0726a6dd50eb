# Rule: Reshapes after a 3-D FlashAttention that give back Y's own shape go.
#
#   Y  = ort_flash.FlashAttention(...)              (B, S, Hq * Dv)
#   Y1 = Reshape(Y, (0, 0, Hq, Dv))                 (layout_3d's split into heads, for the export's merge)
#   Y2 = Reshape(Y1, Concat(B, S, Hq * Dv))         (the export's merge of the heads, from Shape nodes)
#
# becomes Y (Y2's uses read Y). A Reshape keeps the elements in order, so a chain of them whose
# last output has Y's shape is the identity. Proven by the shapes the rewriter inferred: every dim
# of the last output is the same integer or the same named symbol as Y's (symbolic shape
# inference gives two dims one symbol only where it proved them equal); a dim that is not known
# declines. On the GPU this removes no kernel (a Reshape is a view) but the host-side work of
# the merge's shape arithmetic, about eight CPU nodes a layer (Shape, Gather, Unsqueeze, Concat
# and the two Reshapes), which a short sequence's run is bound by. Its declines are not reported:
# the Reshapes then stay in the graph (GPT-2's export also reads the split heads' shape, so its
# merge stays).
from __future__ import annotations

import onnx_ir as ir

from ort_flash.rewriter import flash_op
from ort_flash.rewriter.onnxscript_api import fail
from ort_flash.rewriter.refinements.base import Refinement

FAMILY = "merge_reshape"


class MergeReshape(Refinement):
    """``steps`` Reshapes (1 or 2) after the node."""
    family = FAMILY

    def __init__(self, steps: int) -> None:
        super().__init__(f"{steps} reshape" + ("s" if steps > 1 else ""))
        self.steps = steps

    def pattern(self, op, q, shape_1, shape_2):
        y = op.FlashAttention(q, _domain=flash_op.DOMAIN, _allow_other_inputs=True,
                              _allow_other_attributes=True)
        y = op.Reshape(y, shape_1, _allow_other_attributes=True)
        if self.steps > 1:
            y = op.Reshape(y, shape_2, _allow_other_attributes=True)
        return y

    def analyze(self, context, node, **_):
        y = node.outputs[0]
        value, reshapes = y, []
        for _ in range(self.steps):
            uses = list(value.uses())
            if not uses or uses[0].node.op_type != "Reshape":
                fail("Y feeds no Reshape")
            if len(uses) != 1 or value.is_graph_output():
                fail("Y (or a Reshape of it) has other uses")
            reshape = uses[0].node
            if reshape.attributes.get("allowzero") is not None and reshape.attributes["allowzero"].value:
                fail("a Reshape has allowzero=1")
            reshapes.append(reshape)
            value = reshape.outputs[0]
        if value.is_graph_output():
            fail("the last Reshape's output is a graph output")
        if not _same_shape(y.shape, value.shape):
            fail(f"the Reshapes give {_fmt(value.shape)}, not Y's {_fmt(y.shape)} (or a dim is not known)")
        return {"node": node, "last": value}

    def rewrite(self, op, **_):
        plan, self._plan = self._plan, None
        return self.emit(op, plan["node"], {}, {}, {}, output=plan["node"].outputs[0])


def rules() -> list:
    # The longer chain first: after it, a single Reshape left over is tried alone.
    return [MergeReshape(2), MergeReshape(1)]


def _known(dim) -> bool:
    return isinstance(dim, int) or (isinstance(dim, ir.SymbolicDim) and dim.value is not None)


def _same_shape(a: ir.Shape | None, b: ir.Shape | None) -> bool:
    if a is None or b is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if not (_known(x) and _known(y)):
            return False
        if isinstance(x, int) != isinstance(y, int):
            return False
        if (x if isinstance(x, int) else x.value) != (y if isinstance(y, int) else y.value):
            return False
    return True


def _fmt(shape) -> str:
    if shape is None:
        return "an unknown shape"
    return "(" + ", ".join(str(d if isinstance(d, int) else (d.value or "?")) for d in shape) + ")"
