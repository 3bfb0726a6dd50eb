# Rule: unfused scaled-dot-product attention, as torch.onnx.export (TorchScript) emits it for
# BERT (additive padding mask) and GPT-2 (causal and padding folded into one additive mask).
#
#   Q (B, Hq, Sq, D)     Kᵀ (B, Hkv, D, Skv)                        V (B, Hkv, Skv, Dv)
#   │                    = Transpose(K', perm)    [transpose_k=True]
#   │                    | any value              [transpose_k=False]
#   └─► MatMul(Q, Kᵀ) ─────────────────────────► S (B, Hq, Sq, Skv)
#       Mul(S, c) | Div(S, c) | —                [scale="mul" | "div" | None; c a constant scalar]
#       Add(S, M) | —                            [mask=True: M rank 2-4, broadcasts to S]
#       Softmax(axis = last)
#       Cast(to = its own dtype) | —             (the no-op cast GPT-2's eager attention exports)
#       MatMul(P, V) ──────────────────────────► Y (B, Hq, Sq, Dv)
#
# becomes
#
#   K = Kᵀ transposed back to (B, Hkv, Skv, D): one Transpose composed with perm, none when
#       perm was [0, 1, 3, 2]
#   Y = ort_flash.FlashAttention(Q, K, V[, M], scale = c | 1/c | 1.0, is_causal = 0)
#
# Hkv is Hq or 1 (MatMul's broadcast of one K/V head is FlashAttention's MQA). Add(S, M) with
# M broadcasting *to* S is exactly the op's additive mask; a mask that could broadcast S up
# (rank 5, or a dim not provably 1 or S's) is left alone.
from __future__ import annotations

import itertools
import math

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter._basics import MatchFailureError

from ort_flash.rewriter import flash_op
from ort_flash.rewriter.report import FusedSubgraph
from ort_flash.rewriter.shapes import dim_text, dims, known_int, report_int, same_dim

FAMILY = "matmul_softmax_attention"
_FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
_SWAP_LAST = (0, 1, 3, 2)


class MatMulSoftmaxAttention(pattern.RewriteRuleClassBase):
    def __init__(self, *, transpose_k: bool, scale: str | None, mask: bool) -> None:
        self.variant = (
            f"k={'transpose' if transpose_k else 'pretransposed'},"
            f"scale={scale or 'none'},mask={'additive' if mask else 'none'}"
        )
        super().__init__(name=f"{FAMILY}[{self.variant}]")
        self.transpose_k, self.scale_op, self.has_mask = transpose_k, scale, mask
        # Softmax node -> (number of matched nodes, reason) for matches whose check failed.
        self.failures: dict[ir.Node, tuple[int, str]] = {}
        self.fused: list[FusedSubgraph] = []
        self._plan: dict | None = None

    def pattern(self, op, q, k, v, scale, mask):
        key_t = op.Transpose(k) if self.transpose_k else k
        scores = op.MatMul(q, key_t)
        if self.scale_op == "mul":
            scores = op.Mul(scores, scale)
        elif self.scale_op == "div":
            scores = op.Div(scores, scale)
        if self.has_mask:
            scores = op.Add(scores, mask)
        probs = op.Softmax(scores)
        probs = pattern.OrValue([op.Cast(probs), probs], tag_var="cast", tag_values=[True, False])
        return op.MatMul(probs, v)

    def check(self, context, q, k, v, scale=None, mask=None, **_):
        chain = _chain(context.root, set(context.nodes))
        softmax = next(n for n in chain if n.op_type == "Softmax")
        try:
            self._plan = self._analyze(context, chain, softmax, q, k, v, scale, mask)
        except MatchFailureError as e:
            best = self.failures.get(softmax)
            if best is None or len(chain) > best[0]:
                self.failures[softmax] = (len(chain), e.reason)
            return pattern.MatchResult().fail(e.reason, softmax)
        return pattern.MatchResult()

    def _analyze(self, context, chain, softmax, q, k, v, scale, mask) -> dict:
        by_type = {n.op_type: n for n in chain}
        qk_matmul = chain[1] if chain[0].op_type == "Transpose" else chain[0]
        key_t = qk_matmul.inputs[1]

        _check_softmax_axis(softmax, context.model.graph.opset_imports.get("", 1))
        scale_value = self._scale_value(scale)

        qd, ktd, vd = dims(q), dims(key_t), dims(v)
        for name, d in (("Q", qd), ("Kᵀ", ktd), ("V", vd)):
            if d is None:
                _fail(f"rank of {name} is unknown")
            if len(d) != 4:
                _fail(f"{name} has rank {len(d)}, not 4 (B, H, S, D)")
        if q.dtype not in _FLOAT_TYPES:
            _fail(f"dtype of Q is {q.dtype}, not float32/float16/bfloat16")
        if not (same_dim(qd[0], ktd[0]) and same_dim(qd[0], vd[0])):
            _fail("batch of Q ({}), K ({}) and V ({}) is not provably equal".format(
                *(dim_text(d[0]) for d in (qd, ktd, vd))))
        hq, hk, hv = qd[1], ktd[1], vd[1]
        if not (same_dim(hk, hv) and (same_dim(hq, hk) or known_int(hk) == 1)):
            _fail(f"heads of Q ({dim_text(hq)}), K ({dim_text(hk)}) and V ({dim_text(hv)}) "
                  "are not provably equal (or one shared K/V head)")
        if self.has_mask:
            _check_mask(dims(mask), (qd[0], hq, qd[2], ktd[3]))
        if "Cast" in by_type:
            _check_noop_cast(by_type["Cast"], softmax)

        key_perm: list[int] | None = list(_SWAP_LAST)
        if self.transpose_k:
            perm_attr = by_type["Transpose"].attributes.get("perm")
            perm = list(perm_attr.as_ints()) if perm_attr is not None else [3, 2, 1, 0]
            if len(perm) != 4:
                _fail(f"the key's Transpose has perm {perm}, not a rank-4 permutation")
            key_perm = [perm[i] for i in _SWAP_LAST]
            if key_perm == [0, 1, 2, 3]:
                key_perm = None
        return {
            "scale": scale_value,
            "key_perm": key_perm,
            "nodes": [n.name or n.op_type for n in chain],
            "scope": _scope(softmax),
            "heads": report_int(hq),
            "head_dim": report_int(qd[3]),
        }

    def _scale_value(self, scale: ir.Value | None) -> float:
        if self.scale_op is None:
            return 1.0
        tensor = None if scale.is_graph_input() else ir.convenience.get_const_tensor(scale)
        if tensor is None:
            _fail("scale is not a constant")
        array = tensor.numpy()
        if array.size != 1 or array.ndim > 4:
            _fail(f"scale is not a scalar (shape {list(array.shape)})")
        c = float(array.reshape(()))
        if not math.isfinite(c) or c == 0.0:
            _fail(f"scale {c} is not a finite non-zero number")
        return c if self.scale_op == "mul" else 1.0 / c

    def rewrite(self, op, q, k, v, mask=None, **_):
        plan, self._plan = self._plan, None
        key = k
        if plan["key_perm"] is not None:
            key = op.Transpose(k, perm=plan["key_perm"])
            key.producer().name = f"{plan['scope']}FlashAttention_key"
            key.name = f"{plan['scope']}FlashAttention_key_output_0"
        inputs = [q, key, v] + ([mask] if self.has_mask else [])
        y = op.FlashAttention(
            *inputs, scale=float(plan["scale"]), is_causal=0,
            _domain=flash_op.DOMAIN, _version=flash_op.VERSION,
        )
        y.producer().name = f"{plan['scope']}FlashAttention"
        self.fused.append(FusedSubgraph(
            rule=FAMILY, variant=self.variant, fused_node=y.producer().name,
            nodes=plan["nodes"], heads=plan["heads"], head_dim=plan["head_dim"], causal=False,
            mask="additive" if self.has_mask else "none", scale=float(plan["scale"]),
        ))
        return y


def rules() -> list[MatMulSoftmaxAttention]:
    """Every variant, the ones that absorb a Transpose of K first."""
    return [
        MatMulSoftmaxAttention(transpose_k=t, scale=s, mask=m)
        for t, s, m in itertools.product((True, False), ("mul", "div", None), (True, False))
    ]


def _fail(reason: str):
    raise MatchFailureError(reason)


def _chain(root: ir.Node, matched: set[ir.Node]) -> list[ir.Node]:
    """The matched nodes in data-flow order: [Transpose,] MatMul, ..., Softmax, [Cast,] MatMul."""
    chain, node = [root], root
    while node.op_type != "MatMul" or node is root:
        node = next(i.producer() for i in node.inputs
                    if i is not None and i.producer() in matched and i.producer() not in chain)
        chain.append(node)
    key_t = node.inputs[1].producer()
    if key_t is not None and key_t in matched:
        chain.append(key_t)
    return chain[::-1]


def _check_softmax_axis(softmax: ir.Node, opset: int) -> None:
    attr = softmax.attributes.get("axis")
    axis = attr.as_int() if attr is not None else (-1 if opset >= 13 else 1)
    if axis == -1:
        return  # the last axis at any rank (opset < 13 coerces to 2-D: still the last axis)
    d = dims(softmax.inputs[0])
    if d is None:
        _fail(f"softmax axis is {axis} and the rank of its input is unknown")
    if axis + (len(d) if axis < 0 else 0) != len(d) - 1:
        _fail(f"softmax axis is {axis}, not the last")


def _check_mask(mask_dims: tuple | None, scores: tuple) -> None:
    if mask_dims is None:
        _fail("mask rank is unknown")
    rank = len(mask_dims)
    if rank > 4:
        _fail(f"mask rank {rank} does not broadcast to (B, H, Sq, Skv)")
    if rank < 2:
        _fail(f"mask rank {rank}: FlashAttention takes a mask of rank 2-4")
    for i, (m, s) in enumerate(zip(mask_dims, scores[4 - rank:])):
        if known_int(m) == 1 or same_dim(m, s):
            continue
        if known_int(s) is not None and known_int(s) > 1 and known_int(m) is None:
            continue  # Add itself forces m to be 1 or s
        _fail(f"mask dim {i} ({dim_text(m)}) does not provably broadcast to "
              f"scores dim ({dim_text(s)})")


def _check_noop_cast(cast: ir.Node, softmax: ir.Node) -> None:
    src = softmax.outputs[0].dtype or softmax.inputs[0].dtype
    to = cast.attributes.get("to")
    if src is None or to is None:
        _fail("Cast after Softmax: dtype unknown")
    if ir.DataType(to.as_int()) != src:
        _fail(f"Cast after Softmax changes the dtype ({src} to {ir.DataType(to.as_int())})")


def _scope(node: ir.Node) -> str:
    """Name prefix for new nodes: the Softmax's scope ("/m/h.0/attn/") or its name + "_"."""
    name = node.name or ""
    return name[: name.rfind("/") + 1] if "/" in name else (f"{name}_" if name else "")
