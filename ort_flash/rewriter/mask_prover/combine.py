"""Elementwise ops over two-valued mask tensors, by truth table (see evaluator).

A mask is built from tensors that take one of two values (``Select(p, a, b)``) or are
predicates; an elementwise op of such tensors (``triu(full(min), 1) * (arange > cache_position)``,
``Where(padding == 0, min, causal)``, ``causal + padding == 0``) depends only on the truth
values of their predicates. ``combine`` evaluates the op for every assignment of the atoms of
those predicates (at most four: comparisons and lookups, And / Or / Not evaluated); where the results take at most two values, it returns the Select (or, for
boolean results, the predicate) that gives them, in the smallest form that this module can name
(a literal, a conjunction, a disjunction, else a sum of minterms). An assignment that no element
can have is evaluated too, so the result is right for every element whatever the predicates'
dependence; it is only less often two-valued. Where the results are one visible value and several
hidden ones (<= MIN_MASKED: CLIP's causal min + padding min = -inf), the hidden ones become the
largest of them, marked ``merged``: equal in every row that keeps a visible key.
"""

from __future__ import annotations

import itertools

from ort_flash.rewriter.mask_prover.domain import (
    MIN_MASKED, TRUE, All, AnyOf, Not, Select, is_const, is_pred,
)

_MAX_VARIABLES = 4


def combine(fn, *args):
    """``fn`` (on Python floats / bools) applied elementwise to ``args`` (Selects or
    predicates), as a Select or predicate; None where an argument is of another kind or the
    results take more than two values."""
    if not all(isinstance(a, Select) or is_pred(a) for a in args):
        return None
    variables = []
    for a in args:
        for atom in _atoms(a.pred if isinstance(a, Select) else a):
            if atom not in variables:
                variables.append(atom)
    if len(variables) > _MAX_VARIABLES:
        return None
    table = {}
    for bits in itertools.product((True, False), repeat=len(variables)):
        truth = dict(zip(variables, bits))
        values = [_value(a, truth) for a in args]
        table[bits] = fn(*values)
    results = list(dict.fromkeys(table.values()))
    if all(isinstance(r, bool) for r in results):
        return _pred([b for b, r in table.items() if r], variables)
    if any(isinstance(r, bool) for r in results):
        return None
    merged = any(isinstance(a, Select) and a.merged for a in args)
    visible = [r for r in results if not r <= MIN_MASKED]
    if len(results) > 2 and len(visible) == 1:  # several hidden values (min + min = -inf)
        hidden = max(r for r in results if r <= MIN_MASKED)
        table = {b: (r if r in visible else hidden) for b, r in table.items()}
        results, merged = [visible[0], hidden], True
    if len(results) > 2:
        return None
    first = results[0]
    if len(results) == 1:
        return Select(TRUE, float(first), float(first), merged)
    return Select(_pred([b for b, r in table.items() if r == first], variables), float(first),
                  float(results[1]), merged)


def _atoms(p) -> list:
    """The predicates that are not And / Or / Not of others."""
    if isinstance(p, (All, AnyOf)):
        return [a for t in p.terms for a in _atoms(t)]
    if isinstance(p, Not):
        return _atoms(p.term)
    return [p]


def _truth(p, truth: dict) -> bool:
    if isinstance(p, All):
        return all(_truth(t, truth) for t in p.terms)
    if isinstance(p, AnyOf):
        return any(_truth(t, truth) for t in p.terms)
    if isinstance(p, Not):
        return not _truth(p.term, truth)
    return truth[p]


def _value(a, truth: dict):
    if isinstance(a, Select):
        if is_const(a):
            return a.a
        return a.a if _truth(a.pred, truth) else a.b
    return _truth(a, truth)


def _pred(true_bits: list, variables: list):
    """The predicate true exactly at the assignments ``true_bits`` of ``variables``."""
    n = len(variables)
    every = list(itertools.product((True, False), repeat=n))
    if not true_bits:
        return AnyOf(())
    if len(true_bits) == len(every):
        return TRUE
    for k in range(n):  # drop a variable the result does not depend on
        if all(((b[:k] + (not b[k],) + b[k + 1:]) in true_bits) for b in true_bits):
            reduced = sorted({b[:k] + b[k + 1:] for b in true_bits}, reverse=True)
            return _pred(reduced, variables[:k] + variables[k + 1:])
    literal = lambda v, bit: v if bit else Not(v)  # noqa: E731
    if n == 1:
        return literal(variables[0], true_bits[0][0])
    if len(true_bits) == 1:
        (bits,) = true_bits
        return All(tuple(literal(v, b) for v, b in zip(variables, bits)))
    false_bits = [b for b in every if b not in true_bits]
    if len(false_bits) == 1:
        (bits,) = false_bits
        return AnyOf(tuple(literal(v, not b) for v, b in zip(variables, bits)))
    return AnyOf(tuple(All(tuple(literal(v, b) for v, b in zip(variables, bits)))
                       for bits in true_bits))
