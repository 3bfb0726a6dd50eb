"""Why a Softmax that no rule's check looked at was not fused: a walk over its neighbourhood.

The rules' own ``check`` failures (axis, scale, mask, shapes) are more precise and win; this
names the structural reason when the pattern did not even match.
"""

from __future__ import annotations

import re

import onnx_ir as ir

_SCALE_OPS = ("Mul", "Div")


def structural_reason(softmax: ir.Node) -> str:
    scores = softmax.inputs[0]
    path, qk = _walk_to_qk(scores)
    if qk is None:
        return "no MatMul(Q,Kᵀ) producer (within Add/Mul/Div/Cast of the softmax input)"
    shape = " → ".join(["MatMul", *path, "Softmax"])
    if not re.fullmatch(r"(Mul |Div )?(Cast )?(Add ){0,2}", "".join(p + " " for p in path)):
        return (f"unsupported op chain {shape} "
                "(expected MatMul → [Mul|Div] → [Cast] → [Add [→ Add]] → Softmax)")
    probs = softmax.outputs[0]
    users = [u.node for u in probs.uses()]
    if len(users) == 1 and users[0].op_type == "Cast":
        probs = users[0].outputs[0]
        users = [u.node for u in probs.uses()]
    if not any(u.op_type == "MatMul" and u.inputs[0] is probs for u in users):
        return "softmax output does not feed MatMul(P, V)"
    for value in _intermediates(qk, softmax):
        if value.is_graph_output() or len(value.uses()) > 1:
            return (f"intermediate {value.name!r} is also used outside the attention "
                    "(e.g. returned attention weights), so the subgraph cannot be replaced")
    return f"no rule matched the chain {shape} → MatMul"


def _walk_to_qk(value: ir.Value, depth: int = 4) -> tuple[list[str], ir.Node | None]:
    """Follow Add/Mul/Div up from ``value`` to a MatMul; return the ops passed and the MatMul."""
    node = value.producer()
    if node is None:
        return [], None
    if node.op_type == "MatMul" and node.domain == "":
        return [], node
    if depth == 0 or node.op_type not in ("Add", "Cast", *_SCALE_OPS):
        return [], None
    for operand in node.inputs:
        if operand is None:
            continue
        path, qk = _walk_to_qk(operand, depth - 1)
        if qk is not None:
            return [*path, node.op_type], qk
    return [], None


def _intermediates(qk: ir.Node, softmax: ir.Node) -> list[ir.Value]:
    values, node = [softmax.outputs[0]], softmax
    while node is not qk:
        value = next(i for i in node.inputs if i is not None and _reaches(i, qk))
        values.append(value)
        node = value.producer()
    return values


def _reaches(value: ir.Value, qk: ir.Node, depth: int = 4) -> bool:
    node = value.producer()
    if node is None or depth == 0:
        return False
    return node is qk or any(i is not None and _reaches(i, qk, depth - 1) for i in node.inputs)
