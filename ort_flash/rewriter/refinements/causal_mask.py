# Rule: a materialized causal / key-padding attention mask, as exporters write it, becomes
# FlashAttention's is_causal flag and a compact key-padding mask.
#
#   m (B, Skv) graph input, 0/1 or bool                    (absent for a pure causal mask)
#   M = any subgraph that the mask prover (mask_prover/analysis.py) proves equal to
#         visible[b, h, i, j] = (j <= i)? and (m[b, j] != 0)?        broadcast to (B, H, Sq, Skv)
#       as Where(visible, 0, c) with c <= -1e4 or -inf (additive), or visible itself (bool);
#       or Add(A, M) where only M has that form (T5: A is the relative position bias), or
#       Where(visible, A, c) (T5's SDPA path: the bias where visible, c elsewhere)
#   Y = ort_flash.FlashAttention(Q, K, V, M[, past_k, past_v], is_causal = 0)
#                                                          [no nonpad_kv_seqlen]
#
# becomes
#
#   P = Where(Unsqueeze(m != 0, [1, 2]), 0, c) (B, 1, 1, Skv)   [additive; bool: the Unsqueeze]
#   Y = ort_flash.FlashAttention(Q, K, V[, P][ + A][, past_k, past_v],
#                                is_causal = (j <= i + offset) in M
#                                [, left_window_size = W where M has j >= i + offset - W])
#
# The causal term must have the op's offset: 0 without a past, the past length (past_k's axis 2)
# with one (query i of a cached step is position past + i: bottom-right). Skv counts the past
# keys too (P + S), and so must the padding input. The node's present outputs (kv_cache) stay.
#
# Equality: a key the mask hides has weight exp(c - max) = 0 in both; the kept keys get the same
# scores. A query row with no visible key at all (only possible when the causal window of a
# padding query holds padding only: left padding) differs when M is finite (c > -inf): the
# original spreads the row's weight over all keys, the fused op over its causal window. Such rows
# are outputs at padding positions; rewrite(..., exact_masked_rows=True) keeps those masks whole.
# With c = -inf (torch's SDPA export) both give 0 in such rows (FlashAttention by definition, the
# export through its Where(IsNaN) guard), and without causal both are identical everywhere.
# A mask of zeros (all keys visible) is dropped.
from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
import sympy as sp

from ort_flash.rewriter.mask_prover.analysis import MIN_MASKED, MaskForm, analyze_mask
from ort_flash.rewriter.onnxscript_api import fail
from ort_flash.rewriter.refinements.base import Refinement, flash_pattern
from ort_flash.rewriter.shapes import Unprovable, attr, equal, value_dims
from ort_flash.rewriter.subgraphs import scope_inputs

FAMILY = "causal_mask"
NOTE_MERGED = ("hidden keys had several mask values (min and -inf), now one: equal except at query "
               "rows with no visible key, where the original averages over some keys")
NOTE = ("causal + key padding with a finite mask value: equal except at query rows whose every "
        "visible key is padding (left-padded positions), where the original averages over all keys")


class CausalMask(Refinement):
    family = FAMILY

    has_present_variant = True

    def __init__(self, *, exact_masked_rows: bool = False, present: bool = False) -> None:
        super().__init__(present=present)
        self.exact_masked_rows = exact_masked_rows
        # The (B, 1, 1, S) mask made from one padding input, per graph and form: every layer of
        # an encoder reads the same one (one Cast and one Where per model, not per layer).
        self._padding_masks: dict[tuple, ir.Value] = {}

    def pattern(self, op, q, k, v, mask):
        return flash_pattern(op, q, k, v, mask, present=self.present)

    def analyze(self, context, node, q, k, v, mask, **_):
        if attr(node, "is_causal", 0):
            fail("the node is already causal")
        if attr(node, "left_window_size", -1) != -1 or attr(node, "right_window_size", -1) != -1:
            fail("the node already has a window")
        if len(node.inputs) > 6 and node.inputs[6] is not None:
            fail("the node has a nonpad_kv_seqlen input")
        past = node.inputs[4] if len(node.inputs) > 4 else None
        scores, offset = _scores_dims(node, q, v, past)
        inputs = {v.name for v in scope_inputs(context)}
        bias, form, term, why = None, None, mask, ""
        for bias_c, term_c, hidden in _candidates(mask):
            try:
                form = analyze_mask(term_c, scores, inputs, causal_offset=offset)
            except Unprovable as e:
                why = why or str(e)
                continue
            if hidden is not None:  # Where(visible, bias, hidden)
                form = dataclasses.replace(form, additive=True, masked_value=hidden)
                if not hidden <= MIN_MASKED:
                    fail(f"the value of hidden keys {hidden} is not a mask value")
            bias, term = bias_c, term_c
            break
        if form is None:
            fail(f"mask not recognised as causal / key padding: {why}")
        if form.padding is not None:
            pd = value_dims(next(i for i in scope_inputs(context) if i.name == form.padding))
            if len(pd) != 2 or not (equal(pd[0], scores[0]) and equal(pd[1], scores[3])):
                fail(f"padding input {form.padding!r} is not (B, Skv)")
            if not form.causal and _compact_already(term):
                fail("the mask is already a compact key-padding mask")
            c = form.padding_equals  # integers up to 256 are exact in every float type, so
            if c is not None and not (c == int(c) and abs(c) <= 256):  # Equal sees the same
                fail(f"padding compared with {c:g}, which not every float type holds exactly")
        note = ""
        if form.merged and np.isfinite(form.masked_value):
            if self.exact_masked_rows:
                fail("the mask hides keys with several values (e.g. min and -inf): rows with no "
                     "visible key differ (exact_masked_rows=True)")
            note = NOTE_MERGED
        elif form.causal and form.padding is not None and form.additive and np.isfinite(form.masked_value):
            if self.exact_masked_rows:
                fail("causal + key padding with a finite mask value differs in fully masked rows "
                     "(exact_masked_rows=True)")
            note = NOTE
        return {"form": form, "bias": bias, "node": node, "note": note,
                "dtype": q.dtype, "padding": _input(context, form.padding), "dims": scores}

    def rewrite(self, op, q, k, v, mask, **_):
        plan, self._plan = self._plan, None
        form: MaskForm = plan["form"]
        node = plan["node"]
        prefix = node.name + "_"
        new_mask = None
        text = "none"
        key = (id(node.graph), id(plan["padding"]), form.padding_equals, form.additive,
               float(form.masked_value) if form.additive else None, str(plan["dtype"]))
        shared = self._padding_masks.get(key) if form.padding is not None else None
        if shared is not None and shared.producer() is not None and shared.producer().graph is node.graph:
            new_mask = shared
            text = "additive (B,1,1,Skv)" if form.additive else "bool (B,1,1,Skv)"
        elif form.padding is not None:
            m = plan["padding"]
            if form.padding_equals is not None:  # visible where m == c (1 - m.float() masks)
                c = op.Constant(value=ir.tensor(np.array(form.padding_equals, m.dtype.numpy())))
                _name(c, prefix + "padding_visible_value")
                m = op.Equal(m, c)
                _name(m, prefix + "padding_bool")
            elif m.dtype != ir.DataType.BOOL:
                m = op.Cast(m, to=ir.DataType.BOOL)
                _name(m, prefix + "padding_bool")
            axes = op.Constant(value=ir.tensor(np.array([1, 2], np.int64)))
            _name(axes, prefix + "padding_axes")
            new_mask = op.Unsqueeze(m, axes)
            _name(new_mask, prefix + "padding_mask")
            b, skv = plan["padding"].shape.dims
            new_mask.shape = ir.Shape([b, 1, 1, skv])
            new_mask.type = ir.TensorType(ir.DataType.BOOL)
            text = "bool (B,1,1,Skv)"
            if form.additive:
                dtype = plan["dtype"].numpy()
                zero = op.Constant(value=ir.tensor(np.array(0, dtype)))
                hidden = op.Constant(value=ir.tensor(np.array(form.masked_value, dtype)))
                _name(zero, prefix + "padding_zero")
                _name(hidden, prefix + "padding_hidden")
                shape = new_mask.shape
                new_mask = op.Where(new_mask, zero, hidden)
                _name(new_mask, prefix + "padding_additive")
                new_mask.shape, new_mask.type = shape, ir.TensorType(plan["dtype"])
                text = "additive (B,1,1,Skv)"
            self._padding_masks[key] = new_mask
        if plan["bias"] is not None:
            if new_mask is None:
                new_mask, text = plan["bias"], "additive bias"
            else:
                new_mask = op.Add(plan["bias"], new_mask)
                _name(new_mask, prefix + "bias_and_padding")
                new_mask.type = ir.TensorType(plan["dtype"])
                text = "additive bias + " + text
        attrs = {"is_causal": int(form.causal)}
        if form.left_window is not None:
            attrs["left_window_size"] = form.left_window
            text += f", left window {form.left_window}"
        report = {"causal": form.causal, "mask": text}
        if plan["note"]:
            report["note"] = plan["note"]
        return self.emit(op, node, {"attn_mask": new_mask}, attrs, report)


def rules(*, exact_masked_rows: bool = False) -> list[CausalMask]:
    return [CausalMask(exact_masked_rows=exact_masked_rows, present=p) for p in (False, True)]


def _scores_dims(node: ir.Node, q: ir.Value, v: ir.Value, past: ir.Value | None) -> tuple:
    """((B, Hq, Sq, Skv), causal offset): Skv read from V (K may be a Transpose the fusion just
    made) plus the past length P, which is also the offset of is_causal (0 without a past)."""
    try:
        qd, kd = value_dims(q), value_dims(v)
        p = sp.Integer(0) if past is None else value_dims(past)[2]
    except Unprovable as e:
        fail(str(e))
    except IndexError:
        fail("past_key is not 4-D")
    if len(qd) == 4 and len(kd) == 4:
        return (qd[0], qd[1], qd[2], p + kd[2]), p
    if len(qd) == 3 and len(kd) == 3:
        heads = attr(node, "q_num_heads")
        if heads is None:
            fail("3-D Q without q_num_heads")
        return (qd[0], sp.Integer(int(heads)), qd[1], p + kd[1]), p
    fail(f"Q and K have ranks {len(qd)} and {len(kd)}")


def _candidates(mask: ir.Value) -> list[tuple[ir.Value | None, ir.Value, float | None]]:
    """(bias, mask term, value of hidden keys for a Where) splits of the mask to analyze."""
    out = [(None, mask, None)]
    producer = mask.producer()
    if producer is None or producer.domain != "":
        return out
    if producer.op_type == "Add":
        a, b = producer.inputs
        out += [(a, b, None), (b, a, None)]
    elif producer.op_type == "Where":
        cond, x, y = producer.inputs
        tensor = ir.convenience.get_const_tensor(y)
        if tensor is not None and tensor.numpy().size == 1:
            out.append((x, cond, float(tensor.numpy().reshape(()))))
    return out


def _compact_already(mask: ir.Value) -> bool:
    """A mask with no query axis (rank < 3 or Sq broadcast) gains nothing from compacting."""
    try:
        d = value_dims(mask)
    except Unprovable:
        return False
    return len(d) < 3 or equal(d[-2], 1)


def _input(context, name: str | None) -> ir.Value | None:
    if name is None:
        return None
    return next(i for i in scope_inputs(context) if i.name == name)


def _name(value: ir.Value, name: str) -> None:
    value.producer().name = name
    value.name = name + "_output_0"
