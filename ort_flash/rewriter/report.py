"""What a rewrite did: per-rule counts, every fused subgraph, every Softmax left alone and why."""

from __future__ import annotations

import dataclasses
import json
from typing import Any


@dataclasses.dataclass
class FusedSubgraph:
    rule: str  # rule family, e.g. "matmul_softmax_attention"
    variant: str  # which constructor flags matched, e.g. "k=transpose,scale=mul,mask=additive"
    fused_node: str  # name of the new FlashAttention node
    nodes: list[str]  # names of the nodes it replaced, in graph order
    heads: int | str  # Hq, or "?" where the shape is not known
    head_dim: int | str  # D, or "?"
    causal: bool
    mask: str  # "none" | "additive"
    scale: float


@dataclasses.dataclass
class UnfusedSoftmax:
    node: str
    reason: str


@dataclasses.dataclass
class RewriteReport:
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    fused: list[FusedSubgraph] = dataclasses.field(default_factory=list)
    unfused: list[UnfusedSoftmax] = dataclasses.field(default_factory=list)
    # How the shapes the checks rely on were inferred: "symbolic" (nothing assumed),
    # "symbolic, assuming a = b, ..." (dims the model broadcasts against each other taken as
    # equal), "onnx" or "none" (fewer fusions provable).
    shape_inference: str = ""

    @property
    def total_fused(self) -> int:
        return sum(self.counts.values())

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
        )

    @classmethod
    def from_json(cls, text: str) -> RewriteReport:
        return cls.from_dict(json.loads(text))

    def format_table(self) -> str:
        lines = []
        counts = ", ".join(f"{rule}: {n}" for rule, n in self.counts.items()) or "none"
        lines.append(f"fused attention subgraphs: {self.total_fused} ({counts}); "
                     f"shapes: {self.shape_inference or 'not inferred'}")
        if self.fused:
            rows = [
                (f.fused_node, f.rule, str(f.heads), str(f.head_dim), "yes" if f.causal else "no",
                 f.mask, f"{f.scale:.6g}", str(len(f.nodes)))
                for f in self.fused
            ]
            header = ("node", "rule", "heads", "head_dim", "causal", "mask", "scale", "replaced")
            lines += _table(header, rows)
        lines.append(f"softmax left unfused: {len(self.unfused)}")
        if self.unfused:
            lines += _table(("node", "reason"), [(u.node, u.reason) for u in self.unfused])
        return "\n".join(lines)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]

    def fmt(row):
        return "  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()

    return [fmt(header), "  " + "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows]
