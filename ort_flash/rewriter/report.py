"""What a rewrite did: per-rule counts, every fused subgraph, every Softmax left alone and why."""

from __future__ import annotations

import dataclasses
import json
from typing import Any


@dataclasses.dataclass
class FusedSubgraph:
    rule: str  # the rule that created the node, e.g. "matmul_softmax_attention"
    variant: str  # which constructor flags matched, e.g. "scale=mul,masks=1"
    fused_node: str  # name of the FlashAttention node
    nodes: list[str]  # names of the nodes it replaced, in graph order
    heads: int | str  # Hq, or "?" where the shape is not known
    head_dim: int | str  # D, or "?"
    causal: bool
    mask: str  # "none", "additive (B,1,S,S)", "bool (B,1,1,S)", ... : kind and shape of attn_mask
    scale: float
    kv_heads: int | str = "?"  # Hkv as the op sees it (fewer than heads after repeat_kv)
    layout: str = "BNSH"  # "BNSH" (4-D inputs) or "BSD" (3-D inputs with head attributes)
    refined_by: list[str] = dataclasses.field(default_factory=list)  # later rules applied to it
    cache: str = ""  # "past/present" where a KV cache's Concat became the op's past/present
    note: str = ""  # where the fused node is not equal bit for bit, what differs


@dataclasses.dataclass
class UnfusedSoftmax:
    node: str
    reason: str


@dataclasses.dataclass
class RewriteReport:
    # Per rule: fused subgraphs it created (fusion rules) or fused nodes it refined (the others).
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    fused: list[FusedSubgraph] = dataclasses.field(default_factory=list)
    unfused: list[UnfusedSoftmax] = dataclasses.field(default_factory=list)
    # How the shapes the checks rely on were inferred: "symbolic" (nothing assumed),
    # "symbolic, assuming a = b, ..." (dims the model broadcasts against each other taken as
    # equal), "onnx" or "none" (fewer fusions provable).
    shape_inference: str = ""
    # Refinements declined, with the reason: fused node -> rule -> reason.
    declined: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    @property
    def total_fused(self) -> int:
        return len(self.fused)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RewriteReport:
        return cls(
            counts={str(k): int(v) for k, v in data.get("counts", {}).items()},
            fused=[FusedSubgraph(**f) for f in data.get("fused", [])],
            unfused=[UnfusedSoftmax(**u) for u in data.get("unfused", [])],
            shape_inference=str(data.get("shape_inference", "")),
            declined={str(k): dict(v) for k, v in data.get("declined", {}).items()},
        )

    @classmethod
    def from_json(cls, text: str) -> RewriteReport:
        return cls.from_dict(json.loads(text))

    def format_table(self) -> str:
        lines = []
        counts = ", ".join(f"{rule}: {n}" for rule, n in self.counts.items() if n) or "none"
        lines.append(f"fused attention subgraphs: {self.total_fused} (rules applied: {counts}); "
                     f"shapes: {self.shape_inference or 'not inferred'}")
        if self.fused:
            rows = [
                (f.fused_node, f.rule, f"{f.heads}/{f.kv_heads}", str(f.head_dim),
                 "yes" if f.causal else "no", f.mask, f.layout + (" +cache" if f.cache else ""),
                 f"{f.scale:.6g}", str(len(f.nodes)))
                for f in self.fused
            ]
            header = ("node", "rule", "heads q/kv", "head_dim", "causal", "mask", "layout",
                      "scale", "replaced")
            lines += _table(header, rows)
            notes = sorted({f.note for f in self.fused if f.note})
            lines += [f"  note: {n}" for n in notes]
        if self.declined:
            lines.append("refinements declined:")
            lines += _table(("node", "rule", "reason"),
                            [(n, r, why) for n, d in self.declined.items() for r, why in d.items()])
        lines.append(f"softmax left unfused: {len(self.unfused)}")
        if self.unfused:
            lines += _table(("node", "reason"), [(u.node, u.reason) for u in self.unfused])
        return "\n".join(lines)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def fmt(row):
        return "  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()

    return [fmt(header), "  " + "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows]
