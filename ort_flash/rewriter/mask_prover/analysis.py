"""What an attention mask computes, proven by abstract evaluation of the subgraph that builds it.

Exporters write the same causal / key-padding mask in many ways: Range + LessOrEqual +
Unsqueeze broadcasting, Trilu on a tensor of ones, Flatten + Gather or GatherND lookups of the
0/1 ``attention_mask`` input, then Where / Cast / Sub / Mul with finfo.min, -10000 or -inf.
Rather than matching each spelling, ``analyze_mask`` evaluates the mask's producers over a small
symbolic domain in which every element is a formula of its own index ``x = (x0, x1, ...)``:

- ``Aff``: integer tensors ``const + Σ coefs[k]·x[k]`` (Range, shape scalars, index arithmetic);
- ``Vec``: rank-1 integer tensors of known entries (Shape results and their slices);
- ``Val`` / ``Nonzero``: a graph input's element at an affine index (``input[idx]`` and
  ``input[idx] != 0``);
- predicates built from ``Le`` (``Σ c·x + c0 <= 0``), ``Nonzero``, ``All`` / ``AnyOf`` / ``Not``;
- ``Select(p, a, b)``: a float tensor, ``a`` where ``p`` holds, else ``b`` (constants are
  ``Select(TRUE, c, c)``).

Shapes come from the inferred value shapes (symbolic dims become sympy symbols), so a dim equality
is proven, never assumed from example sizes. Any op or form outside the domain raises
``Unprovable`` with the reason; the caller keeps the mask as it is.

``analyze_mask`` then reads the final formula, aligned to the scores (B, H, Sq, Skv), as a
conjunction of: causal (``x3 <= x2``), a left window (``x3 >= x2 - W``), key padding (``m[x0, x3] != 0``, or ``m[x0, x3] == c``,
for a rank-2 graph input ``m`` of dims (B, Skv)), and terms that are always true.
"""

from __future__ import annotations

import dataclasses
import math

import onnx_ir as ir
import sympy as sp

from ort_flash.rewriter.mask_prover.domain import (
    MIN_MASKED, All, AnyOf, Eq, Le, Not, Nonzero, Select, aff_index, broadcast_to, is_pred,
)
from ort_flash.rewriter.mask_prover.evaluator import Evaluator
from ort_flash.rewriter.shapes import Unprovable, equal

__all__ = ["MIN_MASKED", "MaskForm", "Unprovable", "analyze_mask"]



@dataclasses.dataclass(frozen=True)
class MaskForm:
    """A mask proven equal to: causal (bottom-right) and/or ``padding[b, key] != 0``."""
    causal: bool
    padding: str | None  # name of the rank-2 (B, Skv) graph input, or None
    additive: bool  # an additive float mask (else bool)
    masked_value: float  # the additive value of hidden keys (-inf for bool)
    padding_equals: float | None = None  # visible where padding == this (None: where != 0)
    merged: bool = False  # several hidden values merged (see domain.Select.merged)
    left_window: int | None = None  # keys at most this many positions before the query's


def analyze_mask(mask: ir.Value, scores_dims: tuple, graph_inputs: set[str], *,
                 causal_offset=0) -> MaskForm:
    """The causal / key-padding form of ``mask`` as it broadcasts to ``scores_dims``
    (B, H, Sq, Skv as sympy exprs), or Unprovable. Causal means key j visible to query i iff
    j <= i + ``causal_offset`` (a sympy expr: the past length of a cached step)."""
    av = Evaluator(graph_inputs)(mask)
    if len(av.dims) > 4:
        raise Unprovable(f"mask rank {len(av.dims)}")
    c = broadcast_to(av, scores_dims)
    if isinstance(c, Select) and c.a != 0.0 and c.b == 0.0:  # Where(hidden, c, 0)
        c = Select(Not(c.pred), 0.0, c.a, c.merged)
    merged = isinstance(c, Select) and c.merged
    if isinstance(c, Select):
        if c.a != 0.0:
            raise Unprovable(f"the mask's value for visible keys is {c.a}, not 0")
        if all(isinstance(t, Le) and _always_true(t) for t in _conjuncts(c.pred)):
            return MaskForm(causal=False, padding=None, additive=True, masked_value=0.0)
        if not c.b <= MIN_MASKED:
            raise Unprovable(f"the mask's value for hidden keys is {c.b}, not a mask value (<= {MIN_MASKED:g})")
        pred, additive, masked = c.pred, True, c.b
    elif is_pred(c):
        pred, additive, masked = c, False, -math.inf
    else:
        what = {"Val": "a graph input's values", "FDiff": "a graph input's values",
                "Aff": "an integer index tensor"}.get(
            type(c).__name__, f"a {type(c).__name__}")
        raise Unprovable(f"the mask is {what}, not a choice between visible and hidden keys")
    causal, padding, equals, window = False, None, None, None
    for term in _conjuncts(pred):
        if isinstance(term, Le) and _always_true(term):
            continue
        if isinstance(term, Le) and _is_causal(term, causal_offset):
            causal = True
            continue
        w = _left_window(term, causal_offset) if isinstance(term, Le) else None
        if w is not None:
            window = w if window is None else min(window, w)
            continue
        if isinstance(term, Le) and _is_causal(term, -term.const):
            raise Unprovable(f"the mask's causal window is offset by {-term.const} (key <= query + "
                             f"{-term.const}), the op's is_causal here by {causal_offset} (the past "
                             "length its past_key input gives)")
        if isinstance(term, (Nonzero, Eq)) and term.index == (aff_index(0, 4), aff_index(3, 4)):
            value = term.value if isinstance(term, Eq) else None
            if padding is not None and (padding, equals) != (term.name, value):
                raise Unprovable("the mask looks up two different padding inputs")
            padding, equals = term.name, value
            continue
        raise Unprovable(f"the mask has a term that is neither causal nor key padding ({_text(term)})")
    return MaskForm(causal=causal, padding=padding, additive=additive, masked_value=masked,
                    padding_equals=equals, merged=merged, left_window=window)


def _conjuncts(pred) -> list:
    if isinstance(pred, All):
        return [t for p in pred.terms for t in _conjuncts(p)]
    if isinstance(pred, Not):
        inner = pred.term
        if isinstance(inner, Not):
            return _conjuncts(inner.term)
        if isinstance(inner, AnyOf):
            return [t for p in inner.terms for t in _conjuncts(Not(p))]
        if isinstance(inner, Le):  # not (s <= 0)  <=>  s >= 1 (integers)  <=>  -s + 1 <= 0
            return [Le(tuple(-c for c in inner.coefs), -inner.const + 1)]
        if isinstance(inner, Eq) and inner.value == 0.0:  # float(m) != 0  <=>  m != 0
            return [Nonzero(inner.name, inner.index)]
        if isinstance(inner, All):  # not (a and b) = (not a) or (not b)
            return _disjunction([Not(t) for t in inner.terms], pred)
    if isinstance(pred, AnyOf):
        return _disjunction(list(pred.terms), pred)
    return [pred]


def _disjunction(terms: list, pred) -> list:
    """``a or b or ...`` as one conjunct where it is one: a single term, or inequalities over
    the same index combination, where the one with the smallest constant holds whenever any
    does (``j <= i or j <= i + P`` is ``j <= i + P`` for P >= 0)."""
    parts = [_conjuncts(t) for t in terms]
    if len(parts) == 1:
        return parts[0]
    if not all(len(p) == 1 and isinstance(p[0], Le) for p in parts):
        return [pred]
    les = [p[0] for p in parts]
    for le in les:
        if all(all(equal(a, b) for a, b in zip(le.coefs, o.coefs))
               and sp.ask(sp.Q.nonnegative(o.const - le.const)) for o in les):
            return [le]
    return [pred]


def _always_true(le: Le) -> bool:
    """Σ c·x + c0 <= 0 for every x >= 0: all c <= 0 and c0 <= 0."""
    return all(sp.ask(sp.Q.nonpositive(c)) for c in (*le.coefs, le.const))


def _is_causal(le: Le, offset) -> bool:
    """x3 - x2 - offset <= 0: key j visible to query i iff j <= i + offset, FlashAttention's
    is_causal (offset 0 without a past: top-left, which with Sq = Skv is also bottom-right;
    the past length P with one: bottom-right, as a cached decoding step's mask is)."""
    c = le.coefs
    return (equal(c[0], 0) and equal(c[1], 0) and equal(c[2], -1) and equal(c[3], 1)
            and equal(le.const, -sp.sympify(offset)))


def _left_window(le: Le, offset) -> int | None:
    """W for x2 - x3 + c <= 0 (key j >= query i + c) with c = offset - W, W a number >= 0: the
    op's left_window_size (pos - j <= W, pos = i + offset; Mistral's sliding window)."""
    c = le.coefs
    if not (equal(c[0], 0) and equal(c[1], 0) and equal(c[2], 1) and equal(c[3], -1)):
        return None
    w = sp.simplify(sp.sympify(offset) - le.const)
    return int(w) if w.is_Integer and w >= 0 else None


def _text(term) -> str:
    if isinstance(term, Le):
        parts = [f"{c}*x{k}" for k, c in enumerate(term.coefs) if not equal(c, 0)]
        return f"{' + '.join(parts) or '0'} + {term.const} <= 0"
    if isinstance(term, Nonzero):
        return f"{term.name}[...] != 0"
    if isinstance(term, Eq):
        return f"{term.name}[...] == {term.value:g}"
    return type(term).__name__
