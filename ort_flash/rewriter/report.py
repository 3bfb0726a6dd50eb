"""What a rewrite did: per-rule counts, every fused subgraph, every Softmax left alone and why."""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap
from typing import Any

WIDTH = 100  # the printed report fits a 100-column terminal
# The rewrite options as a CLI user changes them (the reasons name the Python keyword argument).
CLI_WORDS = {
    "(exact_masked_rows=True)": "(kept by default; `ort-flash rewrite --fast-padded-rows`, "
                                "exact_masked_rows=False in Python, maps it to is_causal)",
    "exact_masked_rows=False takes it as -inf": "`ort-flash rewrite --fast-padded-rows` "
                                                 "(exact_masked_rows=False in Python) takes it as -inf",
}


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
    # "BNSH" (4-D inputs), "BSD" (3-D inputs with head attributes), "packed" (3-D packed QKV) or
    # "packed KV" (3-D Q and packed KV, after bias_fold)
    layout: str = "BNSH"
    refined_by: list[str] = dataclasses.field(default_factory=list)  # later rules applied to it
    cache: str = ""  # "past/present" where a KV cache's Concat became the op's past/present
    note: str = ""  # where the fused node is not equal bit for bit, what differs
    graph: str = ""  # "" for the main graph, else the subgraph ("/decoder/If.then_branch")


GRAPH_MAIN = "main"  # how the table names the main graph where some entry is in a subgraph
# Where a node stamped attention_precision="fp8" runs FP8 (the op decides at each call).
FP8_SCOPE = "opt-in; on sm_90 GPUs (H100/H200) only, prefill only; elsewhere in the node's dtype"


@dataclasses.dataclass
class UnfusedSoftmax:
    node: str
    reason: str
    graph: str = ""  # as FusedSubgraph.graph


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
    # Refinements declined, with the reason: fused node -> rule -> reason (a node in a subgraph
    # as "<graph> > <node>", subgraphs.qualified).
    declined: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    # rewrite's attention_precision, and the nodes stamped attention_precision="fp8" (as
    # ``declined`` names them): those run FP8 attention where FP8_SCOPE allows.
    attention_precision: str = "model"
    fp8_nodes: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)  # on the whole rewrite, one line each

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
            attention_precision=str(data.get("attention_precision", "model")),
            fp8_nodes=[str(n) for n in data.get("fp8_nodes", [])],
            notes=[str(n) for n in data.get("notes", [])],
        )

    @classmethod
    def from_json(cls, text: str) -> RewriteReport:
        return cls.from_dict(json.loads(text))

    def format_table(self) -> str:
        lines = []
        counts = ", ".join(f"{rule}: {n}" for rule, n in self.counts.items() if n) or "none"
        lines += textwrap.wrap(f"fused attention subgraphs: {self.total_fused} (rules applied: "
                               f"{counts}); shapes: {self.shape_inference or 'not inferred'}",
                               WIDTH, subsequent_indent="  ")
        if self.fused:
            rows = [
                (f.fused_node, f.rule, f"{f.heads}/{f.kv_heads}", str(f.head_dim),
                 "yes" if f.causal else "no", f.mask, f.layout + (" +cache" if f.cache else ""),
                 f"{f.scale:.6g}", str(len(f.nodes)))
                for f in self.fused
            ]
            header = ("node", "rule", "q/kv heads", "head dim", "causal", "mask", "layout",
                      "scale", "nodes replaced")
            lines += _with_graph(header, rows, [f.graph for f in self.fused])
            notes = sorted({f.note for f in self.fused if f.note})
            for n in notes:
                lines += textwrap.wrap(f"note: {n}", WIDTH, initial_indent="  ", subsequent_indent="    ")
        if self.declined:
            lines.append("refinements declined:")
            lines += _table(("node", "rule", "reason"),
                            [(n, r, _cli_words(why)) for n, d in self.declined.items()
                             for r, why in d.items()])
        lines.append(f"softmax left unfused: {len(self.unfused)}")
        if self.unfused:
            lines += _with_graph(("node", "reason"), [(u.node, _cli_words(u.reason)) for u in self.unfused],
                                 [u.graph for u in self.unfused])
        if self.attention_precision == "fp8":
            lines += textwrap.wrap(f"FP8 attention ({FP8_SCOPE}): {len(self.fp8_nodes)} node(s)"
                                   + (": " + ", ".join(self.fp8_nodes) if self.fp8_nodes else ""),
                                   WIDTH, subsequent_indent="  ")
        for n in self.notes:
            lines += textwrap.wrap(f"note: {n}", WIDTH, subsequent_indent="  ")
        return "\n".join(lines)


def _with_graph(header: tuple[str, ...], rows: list[tuple[str, ...]], graphs: list[str]) -> list[str]:
    """The table, with a first column naming each row's graph where any is a subgraph."""
    if not any(graphs):
        return _table(header, rows)
    return _table(("graph", *header), [(g or GRAPH_MAIN, *r) for g, r in zip(graphs, rows)])


def _cli_words(reason: str) -> str:
    for python, cli in CLI_WORDS.items():
        reason = reason.replace(python, cli)
    return reason


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], width: int = WIDTH) -> list[str]:
    """Columns padded to their widest cell; where the table is wider than ``width``, the columns
    with the most room are narrowed (never below their longest unbreakable piece) and their cells
    wrap onto more lines."""
    cells = [[str(c) for c in row] for row in (header, *rows)]
    widths = [max(len(c) for c in col) for col in zip(*cells)]
    floor = [max(len(piece.rstrip()) for c in col for piece in _pieces(c)) for col in zip(*cells)]
    while 2 + 2 * (len(widths) - 1) + sum(widths) > width:
        i = max(range(len(widths)), key=lambda j: widths[j] - floor[j])
        if widths[i] <= floor[i]:
            break
        widths[i] -= 1

    def fmt(row):
        parts = [_wrap(c, w) for c, w in zip(row, widths)]
        return ["  " + "  ".join((p[k] if k < len(p) else "").ljust(w)
                                 for p, w in zip(parts, widths)).rstrip()
                for k in range(max(len(p) for p in parts))]

    lines = fmt(cells[0]) + ["  " + "  ".join("-" * w for w in widths)]
    for row in cells[1:]:
        lines += fmt(row)
    return lines


def _wrap(text: str, width: int) -> list[str]:
    """Greedy line filling over ``_pieces``; a piece longer than ``width`` is cut."""
    lines, line = [], ""
    for piece in _pieces(text):
        if line and len((line + piece).rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        line += piece
        while len(line.rstrip()) > width:
            lines.append(line[:width])
            line = line[width:]
    lines.append(line.rstrip())
    return lines


def _pieces(text: str) -> list[str]:
    """``text`` cut after each '/', ' ', ',' and '_' (node paths break at their slashes)."""
    return re.split(r"(?<=[/ ,_])", text)
