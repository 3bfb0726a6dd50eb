# Rule: unfused scaled-dot-product attention as "eager" attention exports it (BERT, GPT-2, LLaMA,
# ViT, T5, BART, Whisper; both torch exporters).
#
#   Q (B, Hq, Sq, D)     Kᵀ (B, Hkv, D, Skv)                        V (B, Hkv, Skv, Dv)
#   [or all three 3-D (B·H, S, D): run as batch 1, B·H heads, see view_3d]
#   └─► MatMul(Q, Kᵀ) ─────────────────────────► S (B, Hq, Sq, Skv)
#       Mul(S, c) | Div(S, c) | —                [scale="mul" | "div" | None; c a constant scalar]
#       Mul(Tanh(Div(S, c)), c) | —              [softcap: Gemma 2's soft-capping, c a constant]
#       Where(keep, S, f) | Where(hide, f, S) | — [fill: eager masked_fill, f = float32 min or
#                                                 -inf; becomes the additive Where(keep, 0, f)
#                                                 (masked_fill.py says why that is exact; float16's
#                                                 -65504 only with exact_masked_rows=False, as -inf)]
#       Add(S, A) | —                            [masks=2: a second additive term, e.g. T5's
#                                                 relative position bias (1, H, Sq, Skv)]
#       Add(S, M) | —                            [masks>=1: M rank 1-4, broadcasts to S]
#       Cast(S, to = its own dtype) | —          [after any step above: softmax(scores.float())
#                                                 in a float32 model; right before the Softmax
#                                                 also float16/bfloat16 -> float32 when the tail
#                                                 casts P back (.type_as(scores))]
#       Softmax(axis = last)
#       Cast(to = its own dtype) | Cast(Cast(·, float32), its dtype) | Where(IsNaN(P), 0, P) | —
#       MatMul(P, V) ──────────────────────────► Y (B, Hq, Sq, Dv)
#
# becomes
#
#   Y = ort_flash.FlashAttention(Q, K, V[, M | Add(A, M)], scale = c | 1/c | 1.0, is_causal = 0
#                                [, softcap = c])
#
# where K (B, Hkv, Skv, D) is recovered from Kᵀ by ``key_source``: Transpose(K', p) becomes one
# Transpose of K' composed with p (none when that is the identity); the dynamo exporter's
# Reshape(Transpose(Reshape(K, (B·H, Skv, D)), [0, 2, 1]), (B, H, D, Skv)) becomes K itself;
# anything else gets Transpose(Kᵀ, [0, 1, 3, 2]). Hkv is Hq or 1 (MatMul's broadcast of one K/V
# head is FlashAttention's MQA). The Where(IsNaN) tail (torch's "safe softmax": a fully masked row
# gives 0) is what FlashAttention does anyway. Later rules refine the fused node: the mask
# (causal_mask), repeated K/V heads (repeat_kv) and the layout (layout_3d).
from __future__ import annotations

import itertools
import math

import onnx_ir as ir
from onnxscript.rewriter import pattern

from ort_flash.rewriter import flash_op
from ort_flash.rewriter.fusions import masked_fill, view_3d, view_4d
from ort_flash.rewriter.fusions.score_casts import check_noop_casts, check_score_casts, maybe_cast
from ort_flash.rewriter.onnxscript_api import as_failure, fail
from ort_flash.rewriter.report import FusedSubgraph
from ort_flash.rewriter.shapes import (
    Unprovable, dim_text, dims, equal, known_int, report_int, same_dim, static_value, value_dims,
)

FAMILY = "matmul_softmax_attention"
_FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
_SWAP_LAST = (0, 1, 3, 2)
_TAILS = ("cast2", "cast", "nan_to_zero", "none")


class MatMulSoftmaxAttention(pattern.RewriteRuleClassBase):
    family = FAMILY

    def __init__(self, *, scale: str | None, masks: int, upcast: bool = False,
                 softcap: bool = False, fill: bool = False, view4d: bool = False,
                 exact_masked_rows: bool = True) -> None:
        self.variant = (f"scale={scale or 'none'},masks={masks}" + (",upcast" if upcast else "")
                        + (",softcap" if softcap else "") + (",fill" if fill else "")
                        + (",view4d" if view4d else ""))
        super().__init__(name=f"{self.family}[{self.variant}]")
        self.scale_op, self.masks, self.upcast, self.softcap = scale, masks, upcast, softcap
        self.fill, self.view4d, self.exact_masked_rows = fill, view4d, exact_masked_rows
        # Softmax node -> (number of matched nodes, reason) for matches whose check failed.
        self.failures: dict[ir.Node, tuple[int, str]] = {}
        self.fused: list[FusedSubgraph] = []
        self._plan: dict | None = None

    # ---- pattern

    def qk_pattern(self, op, q, kt, scale, scale_k):
        scores = maybe_cast(op, op.MatMul(q, kt), "cast_qk")
        if self.scale_op == "mul":
            scores = op.Mul(scores, scale)
        elif self.scale_op == "div":
            scores = op.Div(scores, scale)
        return scores

    def pattern(self, op, q, kt, v, scale, scale_k, bias, mask, zero, cap, cap_out, cond, fill,
                cond_x, shaped, shape4, shape3):
        scores = self.qk_pattern(op, q, kt, scale, scale_k)
        if self.scale_op is not None:  # (without a scale, qk_pattern's own Cast is this one:
            scores = maybe_cast(op, scores, "cast_scaled")  # nested OrValues do not match)
        if self.view4d:  # 3-D scores [+ bias], viewed as 4-D, [fill] [+ mask]: see view_4d
            if self.masks >= 1:  # (here masks=1 is the 3-D bias, 2 adds a 4-D mask)
                scores = op.Add(scores, bias)
            scores = op.Reshape(scores, shape4, _allow_other_attributes=True)
            if self.fill:
                scores = masked_fill.fill_pattern(op, scores, cond, fill, cond_x, shaped)
            if self.masks >= 2:
                scores = op.Add(scores, mask)
            probs = op.Softmax(scores)
            probs = pattern.OrValue([op.Cast(probs), probs], tag_var="tail",
                                    tag_values=["cast", "none"])
            return op.MatMul(op.Reshape(probs, shape3, _allow_other_attributes=True), v)
        if self.softcap:  # Gemma 2: scores = tanh(scores / c) * c
            scores = op.Mul(op.Tanh(op.Div(scores, cap)), cap_out)
        if self.fill:  # eager masked_fill: Where(keep, S, c) | Where(hide, c, S)
            scores = masked_fill.fill_pattern(op, scores, cond, fill, cond_x, shaped)
        if self.upcast:
            scores = op.Cast(scores, to=ir.DataType.FLOAT)
        if self.masks >= 2:
            scores = maybe_cast(op, op.Add(scores, bias), "cast_bias")
        if self.masks >= 1:
            scores = maybe_cast(op, op.Add(scores, mask), "cast_masked")
        probs = op.Softmax(scores)
        probs = pattern.OrValue(
            [op.Cast(op.Cast(probs)), op.Cast(probs), op.Where(op.IsNaN(probs), zero, probs), probs],
            tag_var="tail", tag_values=list(_TAILS),
        )
        return op.MatMul(probs, op.Cast(v, to=ir.DataType.FLOAT) if self.upcast else v)

    # ---- check

    def check(self, context, q, kt, v, scale=None, scale_k=None, bias=None, mask=None, zero=None,
              tail="none", cap=None, cap_out=None, cond=None, fill=None, fill_side="keep",
              cond_x=None, shaped=None, **_):
        nodes = list(context.nodes)
        softmax = next(n for n in nodes if n.op_type == "Softmax")
        try:
            self._plan = self._analyze(context, nodes, softmax, q, kt, v, scale, scale_k, bias,
                                       mask, zero, tail)
            if self.softcap:
                self._plan["softcap"] = softcap_value(cap, cap_out)
            if self.fill:
                if fill_side.endswith("_expanded") and shaped is not softmax_scores(softmax, nodes):
                    fail("the masked_fill condition is expanded to the shape of another tensor")
                cond = masked_fill.condition(cond, cond_x, fill_side)
                c, hidden = masked_fill.fill_value(cond, fill, exact_masked_rows=self.exact_masked_rows)
                self._plan["fill"] = (hidden, fill_side, cond)
                self._plan["note"] = masked_fill.note(c) if hidden != c else ""
                check_mask(dims(cond), dims(softmax.inputs[0]))
                self._plan["mask"] = ("additive " + shape_text(cond) + (
                    "" if mask is None else " + " + self._plan["mask"].split(" ", 1)[1]))
        except Exception as e:  # noqa: BLE001 - a bug in a check must decline, not crash
            e = as_failure(e)
            best = self.failures.get(softmax)
            if best is None or len(nodes) > best[0]:
                self.failures[softmax] = (len(nodes), e.reason)
            return pattern.MatchResult().fail(e.reason, softmax)
        return pattern.MatchResult()

    def scale_value(self, scale: ir.Value | None, scale_k: ir.Value | None) -> float:
        if self.scale_op is None:
            return 1.0
        c = constant_scalar(scale, "scale")
        return c if self.scale_op == "mul" else 1.0 / c

    def _analyze(self, context, nodes, softmax, q, kt, v, scale, scale_k, bias, mask, zero, tail):
        check_softmax_axis(softmax, context.model.graph.opset_imports.get("", 1))
        scale_value = self.scale_value(scale, scale_k)
        qd, ktd, vd = dims(q), dims(kt), dims(v)
        for name, d in (("Q", qd), ("Kᵀ", ktd), ("V", vd)):
            if d is None:
                fail(f"rank of {name} is unknown")
        view3d = len(qd) == len(ktd) == len(vd) == 3 and not self.view4d  # see view_3d
        if view3d:
            qd, ktd, vd = ((1, *d) for d in (qd, ktd, vd))
        heads4 = None
        if self.view4d:
            if not len(qd) == len(ktd) == len(vd) == 3:
                fail("the scores are viewed as 4-D, but Q, Kᵀ, V are not all 3-D")
            reshape4 = next(n for n in nodes if n.op_type == "Reshape" and
                            n.outputs[0].uses()[0].node.op_type != "MatMul")
            reshape3 = next(n for n in nodes if n.op_type == "Reshape" and n is not reshape4)
            heads4 = view_4d.check(reshape4.inputs[0], reshape4.outputs[0], reshape3.outputs[0])
            if bias is not None:
                view_4d.check_bias(bias, value_dims(q)[0])
            b4 = dims(reshape4.outputs[0])[0]
            qd, ktd, vd = ((b4, heads4, *d[1:]) for d in (qd, ktd, vd))
            bias = None  # checked above, against the 3-D scores
        for name, d in (("Q", qd), ("Kᵀ", ktd), ("V", vd)):
            if len(d) != 4:
                fail(f"{name} has rank {len(d)}, not 4 (B, H, S, D) or 3 (B·H, S, D) like all")
        if q.dtype not in _FLOAT_TYPES:
            fail(f"dtype of Q is {q.dtype}, not float32/float16/bfloat16")
        if self.upcast and not (q.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
                                and kt.dtype == q.dtype and v.dtype == q.dtype):
            fail(f"the float32 upcast is not of float16/bfloat16 Q, K, V ({q.dtype})")
        if not (same_dim(qd[0], ktd[0]) and same_dim(qd[0], vd[0])):
            fail("batch of Q ({}), K ({}) and V ({}) is not provably equal".format(
                *(dim_text(d[0]) for d in (qd, ktd, vd))))
        hq, hk, hv = qd[1], ktd[1], vd[1]
        if not (same_dim(hk, hv) and (same_dim(hq, hk) or known_int(hk) == 1)):
            fail(f"heads of Q ({dim_text(hq)}), K ({dim_text(hk)}) and V ({dim_text(hv)}) "
                 "are not provably equal (or one shared K/V head)")
        scores = (qd[0], hq, qd[2], ktd[3])
        for term in (bias, mask):
            if term is not None:
                check_mask(dims(term), scores)
        widened = check_score_casts(softmax, set(nodes), self.upcast)
        if tail in ("cast", "cast2"):
            check_noop_casts(softmax, q.dtype if widened else None)
        elif widened:
            fail(f"the scores are cast to float32 before the Softmax and not back to {q.dtype}")
        elif tail == "nan_to_zero":
            if constant_scalar(zero, "the value that replaces NaN") != 0.0:
                fail("NaN in the softmax is replaced by a value other than 0")
        key, key_perm = view_3d.key_source(kt) if view3d or heads4 else key_source(kt)
        if view3d and not same_dim(hq, hk):
            fail(f"heads of Q ({dim_text(hq)}) and K ({dim_text(hk)}) differ in the 3-D view")
        mask_text = "none"
        if mask is not None:
            mask_text = "additive " + shape_text(mask) + (" + " + shape_text(bias) if bias else "")
        return {
            "scale": scale_value, "key": key, "key_perm": key_perm, "y": context.root.outputs[0],
            "nodes": [n.name or n.op_type for n in nodes], "scope": scope(softmax),
            "heads": report_int(hq), "kv_heads": report_int(hk), "head_dim": report_int(qd[3]),
            "mask": mask_text, "view3d": view3d, "view4d": heads4,
        }

    # ---- rewrite

    def rewrite(self, op, q, kt, v, bias=None, mask=None, cond=None, **_):
        plan, self._plan = self._plan, None
        if "fill" in plan:
            c, side, cond = plan["fill"]
            filled = masked_fill.fill_mask(op, cond, c, side, q.dtype, plan["scope"] + "FlashAttention_")
            if mask is not None:
                shape = masked_fill.broadcast_shape(filled.shape, mask.shape)
                mask_type, filled = mask.type, op.Add(filled, mask)
                filled.producer().name = f"{plan['scope']}FlashAttention_fill_and_mask"
                filled.name = f"{plan['scope']}FlashAttention_fill_and_mask_output_0"
                filled.type, filled.shape = mask_type, shape
            mask = filled
        key = plan["key"]
        if plan["key_perm"] is not None:
            source_dims = dims(key)
            key = op.Transpose(key, perm=plan["key_perm"])
            key.producer().name = f"{plan['scope']}FlashAttention_key"
            key.name = f"{plan['scope']}FlashAttention_key_output_0"
            if source_dims is not None:
                key.shape = ir.Shape([source_dims[p] for p in plan["key_perm"]])
            key.type = v.type
        if plan["view4d"]:
            q, key, v, bias = (
                None if x is None else view_4d.to_4d(
                    op, x, plan["view4d"], f"{plan['scope']}FlashAttention_{n}4d")
                for x, n in ((q, "q"), (key, "k"), (v, "v"), (bias, "bias")))
        if plan["view3d"]:
            q, key, v = (view_3d.unsqueeze(op, x, f"{plan['scope']}FlashAttention_{n}4d")
                         for x, n in ((q, "q"), (key, "k"), (v, "v")))
            bias = view_3d.lift(op, bias, f"{plan['scope']}FlashAttention_bias4d")
            mask = view_3d.lift(op, mask, f"{plan['scope']}FlashAttention_mask4d")
        inputs = [q, key, v]
        if mask is not None and self.upcast:  # 0 / -inf (or a bias) in Q's dtype
            mask = op.Cast(mask, to=q.dtype)
            mask.producer().name = f"{plan['scope']}FlashAttention_mask_cast"
            mask.name = f"{plan['scope']}FlashAttention_mask_cast_output_0"
            mask.type = ir.TensorType(q.dtype)
        if mask is not None:
            if bias is not None:
                mask_type = mask.type
                mask = op.Add(bias, mask)
                mask.producer().name = f"{plan['scope']}FlashAttention_mask"
                mask.name = f"{plan['scope']}FlashAttention_mask_output_0"
                mask.type = mask_type
            inputs.append(mask)
        extra = {"softcap": plan["softcap"]} if "softcap" in plan else {}
        y = op.FlashAttention(
            *inputs, scale=float(plan["scale"]), is_causal=0, **extra,
            _domain=flash_op.DOMAIN, _version=flash_op.VERSION,
        )
        y.producer().name = f"{plan['scope']}FlashAttention"
        y.shape, y.type = plan["y"].shape, ir.TensorType(q.dtype)
        if plan["view3d"]:
            y.shape = None if plan["y"].shape is None else ir.Shape([1, *plan["y"].shape.dims])
        if plan["view4d"]:
            y.shape = None
        self.fused.append(FusedSubgraph(
            rule=self.family, variant=self.variant, fused_node=y.producer().name,
            nodes=plan["nodes"], heads=plan["heads"], kv_heads=plan["kv_heads"],
            head_dim=plan["head_dim"], causal=False, mask=plan["mask"], scale=float(plan["scale"]),
            note=plan.get("note", ""),
        ))
        if plan["view3d"]:
            y = view_3d.squeeze(op, y, plan["y"], f"{plan['scope']}FlashAttention_3d")
            y.type = ir.TensorType(q.dtype)
        if plan["view4d"]:
            y = view_4d.to_3d(op, y, plan["y"], f"{plan['scope']}FlashAttention_3d")
        if self.upcast:  # the exporter computed this attention in float32 and returns float32
            y = op.Cast(y, to=ir.DataType.FLOAT)
            y.producer().name = f"{plan['scope']}FlashAttention_float32"
            y.shape, y.type = plan["y"].shape, plan["y"].type
        return y


def rules(*, exact_masked_rows: bool = True) -> list[MatMulSoftmaxAttention]:
    """Every variant, longest chains first (so two-mask chains are not split)."""
    return [MatMulSoftmaxAttention(scale=s, masks=m, softcap=c, fill=f, view4d=w,
                                   exact_masked_rows=exact_masked_rows)
            for w, f, c, m, s in itertools.product((True, False), (True, False), (True, False),
                                                   (2, 1, 0), ("mul", "div", None))
            if not (w and c)]


def softcap_value(cap: ir.Value | None, cap_out: ir.Value | None) -> float:
    """c of tanh(s / c) * c: both constants, equal and positive (the op's softcap)."""
    c_in, c_out = constant_scalar(cap, "softcap divisor"), constant_scalar(cap_out, "softcap factor")
    if c_in != c_out:
        fail(f"softcap divides by {c_in} and multiplies by {c_out}, not the same c")
    if c_in <= 0:
        fail(f"softcap {c_in} is not positive")
    return float(c_in)


# ---------------------------------------------------------------- shared checks


def constant_scalar(value: ir.Value | None, what: str) -> float:
    """A constant scalar, or one computed only from constants and static dims (a scale of
    1/Sqrt(Cast(Shape(q)[-1])): see shapes.static_value)."""
    tensor = None if value is None or value.is_graph_input() else ir.convenience.get_const_tensor(value)
    array = tensor.numpy() if tensor is not None else static_value(value)
    if array is None or array.dtype == object:
        fail(f"{what} is not a constant")
    if array.size != 1 or array.ndim > 4:
        fail(f"{what} is not a scalar (shape {list(array.shape)})")
    c = float(array.reshape(()))
    if not math.isfinite(c) or (c == 0.0 and what.startswith("scale")):
        fail(f"{what} {c} is not a finite non-zero number")
    return c


def key_source(kt: ir.Value) -> tuple[ir.Value, list[int] | None]:
    """K (B, H, Skv, D) as (value, perm to apply or None) for the Kᵀ (B, H, D, Skv) of QKᵀ."""
    node = kt.producer()
    if node is not None and node.op_type == "Transpose" and node.domain == "" and len(kt.uses()) == 1:
        attr = node.attributes.get("perm")
        perm = list(attr.as_ints()) if attr is not None else [3, 2, 1, 0]
        if len(perm) == 4:
            composed = [perm[i] for i in _SWAP_LAST]
            return node.inputs[0], (None if composed == [0, 1, 2, 3] else composed)
    source = _reshape_transpose_reshape(kt)
    if source is not None:
        return source, None
    return kt, list(_SWAP_LAST)


def _reshape_transpose_reshape(kt: ir.Value) -> ir.Value | None:
    """K for Kᵀ = Reshape(Transpose(Reshape(K, (B·H, S, D)), [0, 2, 1]), (B, H, D, S))."""
    outer = kt.producer()
    if outer is None or outer.op_type != "Reshape" or len(kt.uses()) != 1:
        return None
    t = outer.inputs[0].producer()
    if t is None or t.op_type != "Transpose" or len(outer.inputs[0].uses()) != 1:
        return None
    perm = t.attributes.get("perm")
    if perm is None or list(perm.as_ints()) != [0, 2, 1]:
        return None
    inner = t.inputs[0].producer()
    if inner is None or inner.op_type != "Reshape":
        return None
    k = inner.inputs[0]
    try:
        kd, md, ktd = value_dims(k), value_dims(inner.outputs[0]), value_dims(kt)
    except Unprovable:
        return None
    if (len(kd), len(md), len(ktd)) != (4, 3, 4):
        return None
    if not (equal(md[0], kd[0] * kd[1]) and equal(md[1], kd[2]) and equal(md[2], kd[3])
            and equal(ktd[0], kd[0]) and equal(ktd[1], kd[1])
            and equal(ktd[2], kd[3]) and equal(ktd[3], kd[2])):
        return None
    return k


def check_softmax_axis(softmax: ir.Node, opset: int) -> None:
    attr = softmax.attributes.get("axis")
    axis = attr.as_int() if attr is not None else (-1 if opset >= 13 else 1)
    if axis == -1:
        return  # the last axis at any rank (opset < 13 coerces to 2-D: still the last axis)
    d = dims(softmax.inputs[0])
    if d is None:
        fail(f"softmax axis is {axis} and the rank of its input is unknown")
    if axis + (len(d) if axis < 0 else 0) != len(d) - 1:
        fail(f"softmax axis is {axis}, not the last")


def check_mask(mask_dims: tuple | None, scores: tuple) -> None:
    if mask_dims is None:
        fail("mask rank is unknown")
    rank = len(mask_dims)
    if rank > 4:
        fail(f"mask rank {rank} does not broadcast to (B, H, Sq, Skv)")
    if rank < 1:
        fail(f"mask rank {rank}: FlashAttention takes a mask of rank 1-4")
    for i, (m, s) in enumerate(zip(mask_dims, scores[4 - rank:])):
        if known_int(m) == 1 or same_dim(m, s):
            continue
        if known_int(s) is not None and known_int(s) > 1 and known_int(m) is None:
            continue  # Add itself forces m to be 1 or s
        fail(f"mask dim {i} ({dim_text(m)}) does not provably broadcast to "
             f"scores dim ({dim_text(s)})")


def softmax_scores(softmax: ir.Node, nodes: list) -> ir.Value | None:
    """The scores the masked_fill Where replaces: its input that comes from the matched chain."""
    where = next((n for n in nodes if n.op_type == "Where"), None)
    matched = set(nodes)
    return None if where is None else next(
        (i for i in where.inputs[1:] if i.producer() is not None and i.producer() in matched), None)


def shape_text(value: ir.Value | None) -> str:
    d = dims(value)
    return "(?)" if d is None else "(" + ",".join(dim_text(x) for x in d) + ")"


def scope(node: ir.Node) -> str:
    """Name prefix for new nodes: the Softmax's scope ("/m/h.0/attn/") or its name + "_"."""
    name = node.name or ""
    return name[: name.rfind("/") + 1] if "/" in name else (f"{name}_" if name else "")
