"""The symbolic domain in which mask subgraphs are evaluated (see analysis).

Every abstract tensor is ``AV(dims, content)``: its dims as sympy expressions (inferred symbolic
dims become positive integer symbols) and a content that gives each element as a formula of its
own index ``x = (x0, x1, ...)``:

- ``Aff``: integer tensors ``const + Σ coefs[k]·x[k]`` (Range, shape scalars, index arithmetic);
- ``Vec``: rank-1 integer tensors of known entries (Shape results and their slices);
- ``Val`` / ``Nonzero``: a graph input's element at an affine index (``input[idx]`` and
  ``input[idx] != 0``); ``Flat``: a flattened (B·S, 1) view of one; ``FDiff`` / ``Eq``: that
  element as a float minus a constant (known only where it is zero) and ``input[idx] == c``;
- predicates built from ``Le`` (``Σ c·x + c0 <= 0``), ``Nonzero``, ``All`` / ``AnyOf`` / ``Not``;
- ``Select(p, a, b)``: a float tensor, ``a`` where ``p`` holds, else ``b`` (constants are
  ``Select(TRUE, c, c)``); ``Stack`` and ``Flattened`` are the intermediate forms of index
  tuples and of a Reshape to rank 1.

Reindexing (Unsqueeze, Expand, broadcasting, Slice) is ``remap`` / ``broadcast_to`` / ``shift``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import sympy as sp

from ort_flash.rewriter.shapes import Unprovable, equal, is_one


@dataclasses.dataclass(frozen=True)
class Aff:
    const: Any
    coefs: tuple


@dataclasses.dataclass(frozen=True)
class Vec:
    items: tuple


@dataclasses.dataclass(frozen=True)
class Val:
    name: str
    index: tuple  # of Aff


@dataclasses.dataclass(frozen=True)
class Nonzero:
    name: str
    index: tuple  # of Aff


@dataclasses.dataclass(frozen=True)
class Eq:
    """The predicate ``input[idx] == value`` (transformers' ``1 - mask.float()`` cast to bool is
    its negation with value 1)."""
    name: str
    index: tuple  # of Aff
    value: float


@dataclasses.dataclass(frozen=True)
class FDiff:
    """A float tensor ``float(input[idx]) - value`` (value 0: the input's value as a float),
    known only where it is zero: exactly where ``input[idx] == value``."""
    name: str
    index: tuple  # of Aff
    value: float


@dataclasses.dataclass(frozen=True)
class Flat:
    """Flatten(input != 0 or input, axis=rank) as (prod dims, 1): element (k, 0) = input[k // d1, k % d1]."""
    name: str
    dims: tuple
    nonzero: bool


@dataclasses.dataclass(frozen=True)
class Le:
    coefs: tuple
    const: Any


@dataclasses.dataclass(frozen=True)
class All:
    terms: tuple


@dataclasses.dataclass(frozen=True)
class AnyOf:
    terms: tuple


@dataclasses.dataclass(frozen=True)
class Not:
    term: Any


@dataclasses.dataclass(frozen=True)
class Select:
    pred: Any
    a: float
    b: float
    # hidden keys had several mask values (causal min + padding min = -inf), merged into ``b``
    # (or ``a``): equal wherever a row keeps a visible key, not in rows that have none
    merged: bool = False


MIN_MASKED = -1.0e4  # an additive mask value at or below this hides a key (exp underflows to 0)


@dataclasses.dataclass(frozen=True)
class Stack:
    """An integer tensor whose last axis stacks ``items`` (Affs over the leading axes)."""
    items: tuple


@dataclasses.dataclass(frozen=True)
class Flattened:
    """A Reshape of ``inner`` (of dims ``dims``) to rank 1."""
    inner: Any
    dims: tuple


TRUE = All(())


@dataclasses.dataclass(frozen=True)
class AV:
    dims: tuple
    c: Any


# ---------------------------------------------------------------- remapping axes


def remap(c, mapping: list, rank: int):
    """``c`` with axis k moved to ``mapping[k]`` (None: a size-1 axis dropped, so x[k] = 0)."""
    if isinstance(c, Aff):
        coefs = [sp.Integer(0)] * rank
        for k, m in enumerate(mapping):
            if m is not None:
                coefs[m] += c.coefs[k]
        return Aff(c.const, tuple(coefs))
    if isinstance(c, Le):
        a = remap(Aff(c.const, c.coefs), mapping, rank)
        return Le(a.coefs, a.const)
    if isinstance(c, (Val, Nonzero, Eq, FDiff)):
        return dataclasses.replace(c, index=tuple(remap(i, mapping, rank) for i in c.index))
    if isinstance(c, (All, AnyOf)):
        return type(c)(tuple(remap(t, mapping, rank) for t in c.terms))
    if isinstance(c, Not):
        return Not(remap(c.term, mapping, rank))
    if isinstance(c, Select):
        return dataclasses.replace(c, pred=remap(c.pred, mapping, rank))
    raise Unprovable(f"cannot re-index a {type(c).__name__}")


def broadcast_to(av: AV, dims: tuple):
    """``av``'s content indexed over ``dims`` (numpy broadcasting, right-aligned)."""
    shift = len(dims) - len(av.dims)
    if shift < 0:
        raise Unprovable("a broadcast lowers the rank")
    mapping = []
    for k, d in enumerate(av.dims):
        out = dims[k + shift]
        if equal(d, out):
            mapping.append(k + shift)
        elif is_one(d):
            mapping.append(None)
        else:
            raise Unprovable(f"dim {d} does not provably broadcast to {out}")
    return remap(av.c, mapping, len(dims))


def shift(c, by: list):
    """``c`` read at x + by (a Slice's starts)."""
    if isinstance(c, Aff):
        return Aff(c.const + sum(k * s for k, s in zip(c.coefs, by)), c.coefs)
    if isinstance(c, Le):
        return Le(c.coefs, c.const + sum(k * s for k, s in zip(c.coefs, by)))
    if isinstance(c, (Val, Nonzero, Eq, FDiff)):
        return dataclasses.replace(c, index=tuple(shift(i, by) for i in c.index))
    if isinstance(c, (All, AnyOf)):
        return type(c)(tuple(shift(t, by) for t in c.terms))
    if isinstance(c, Not):
        return Not(shift(c.term, by))
    if isinstance(c, Select):
        return dataclasses.replace(c, pred=shift(c.pred, by))
    raise Unprovable(f"cannot slice a {type(c).__name__}")


def aff_index(k: int, rank: int) -> Aff:
    coefs = [sp.Integer(0)] * rank
    coefs[k] = sp.Integer(1)
    return Aff(sp.Integer(0), tuple(coefs))


# ---------------------------------------------------------------- evaluation



def is_pred(c) -> bool:
    return isinstance(c, (Le, Nonzero, Eq, All, AnyOf, Not))



def is_const(c) -> bool:
    """Content that does not depend on the index (the same value everywhere)."""
    if isinstance(c, Aff):
        return not any(nonzero_coefs(c.coefs))
    if isinstance(c, Select):
        return c.pred == TRUE and c.a == c.b
    return c == TRUE or c == AnyOf(())



def const_value(c):
    if isinstance(c, Aff):
        return c.const
    if isinstance(c, Select):
        return c.a
    return 1 if c == TRUE else 0



def const_like(c, rank: int):
    """The constant ``c`` over ``rank`` axes."""
    if isinstance(c, Aff):
        return Aff(c.const, (sp.Integer(0),) * rank)
    return c



def select_to_pred(c: Select):
    if c.pred == TRUE and c.a == c.b:
        return TRUE if c.a != 0 else AnyOf(())
    if c.a != 0 and c.b == 0:
        return c.pred
    if c.a == 0 and c.b != 0:
        return Not(c.pred)
    raise Unprovable("Cast to bool of a select of two non-zero values")



def nonzero_coefs(coefs) -> list:
    return [c for c in coefs if not equal(c, sp.Integer(0))]



def le_of(a: Aff, b: Aff, plus: int) -> Le:
    return Le(tuple(p - q for p, q in zip(a.coefs, b.coefs)), a.const - b.const + plus)



def fl(fn, p: float, q: float) -> float:
    with np.errstate(all="ignore"):
        return float(fn(np.float64(p), np.float64(q)))
