"""The Casts matmul_softmax_attention accepts in the score chain and after the Softmax.

``maybe_cast`` puts an optional Cast into the pattern; ``check_score_casts`` proves those on the
scores harmless (no-ops, or one widening to float32 right before the Softmax that the tail
undoes); ``check_noop_casts`` proves the tail after the Softmax the identity.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_flash.rewriter.onnxscript_api import fail

_WIDER = {ir.DataType.FLOAT: 32, ir.DataType.DOUBLE: 64, ir.DataType.FLOAT16: 16,
          ir.DataType.BFLOAT16: 16}


def maybe_cast(op, scores, tag: str):
    """``scores`` or Cast(scores): a Cast that check_score_casts must prove harmless."""
    return pattern.OrValue([op.Cast(scores), scores], tag_var=tag, tag_values=[True, False])


def check_score_casts(softmax: ir.Node, matched: set, upcast: bool) -> bool:
    """Every Cast on the scores' path from QKᵀ to the Softmax is a no-op (to its input's own
    dtype: transformers' ``softmax(scores.float())`` in a float32 model), except the upcast
    variant's float32 Cast and one float16/bfloat16 -> float32 Cast right before the Softmax
    (``softmax(scores.float()).type_as(scores)``: the op's softmax runs in float32 anyway).
    Returns whether the Softmax input was so widened (its tail must then cast back)."""
    widened, value, first = False, softmax.inputs[0], True
    widening_left = 1 if upcast else 0
    while (node := value.producer()) is not None and node in matched:
        if node.op_type == "Cast":
            src, to = node.inputs[0].dtype, node.attributes.get("to")
            to = ir.DataType(to.as_int()) if to is not None else None
            if src is None or to is None:
                fail("a Cast in the scores has an unknown dtype")
            if to != src:
                wide = (to == ir.DataType.FLOAT
                        and src in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16))
                if wide and widening_left:
                    widening_left -= 1
                elif wide and first:
                    widened = True
                else:
                    fail(f"a Cast in the scores changes their dtype ({src} to {to})")
        first = False
        if node.op_type == "MatMul":
            break
        value = next((i for i in node.inputs
                      if i is not None and i.producer() is not None and i.producer() in matched),
                     None)
        if value is None:
            break
    return widened


def check_noop_casts(softmax: ir.Node, want: ir.DataType | None = None) -> None:
    """The Cast chain after the Softmax ends in its dtype (or ``want``, the attention's dtype
    where the Softmax ran widened) through types no narrower (so it is the identity:
    fp16 -> fp32 -> fp16 is exact)."""
    src = softmax.outputs[0].dtype or softmax.inputs[0].dtype
    value, types = softmax.outputs[0], []
    while len(value.uses()) == 1 and value.uses()[0].node.op_type == "Cast":
        cast = value.uses()[0].node
        to = cast.attributes.get("to")
        if to is None:
            fail("Cast after Softmax without a target type")
        types.append(ir.DataType(to.as_int()))
        value = cast.outputs[0]
    if src is None:
        fail("Cast after Softmax: dtype unknown")
    if types[-1] != (want or src):
        fail(f"Cast after Softmax changes the dtype ({src} to {types[-1]})")
    for t in types[:-1]:
        if t != src and not (_WIDER.get(t, 0) > _WIDER.get(src, 99) and t != ir.DataType.FLOAT16):
            fail(f"Cast after Softmax goes through {t}, narrower than {src}")
