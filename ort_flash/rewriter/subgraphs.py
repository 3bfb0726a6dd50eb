"""The graphs of a model: the main graph and every subgraph (If branches, Loop/Scan bodies, nested).

ONNX lets sibling subgraphs reuse value names (an Optimum merged decoder's two ``If`` branches
share hundreds), and a subgraph reads values of its enclosing graphs by name. Tools keyed by
name alone (ONNX's data propagation keeps one table for the whole model) then mix up the
branches, so ``unique_names`` renames what a subgraph defines to names unique in the model, and
``rename`` maps them back. ``subgraphs`` walks a ModelProto; ``graph_labels`` names the graphs of
an ``ir.Model`` for the report.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx_ir as ir

# A subgraph's place in the model: per level, the owning node's first output, the attribute
# and the index within a GRAPHS attribute. The main graph is ().
GraphKey = tuple[tuple[str, str, int], ...]


def subgraphs(graph: onnx.GraphProto, key: GraphKey = ()) -> Iterator[tuple[GraphKey, onnx.GraphProto]]:
    """``graph`` and every graph nested in its nodes' attributes, outermost first."""
    yield key, graph
    for node in graph.node:
        for attr in node.attribute:
            owner = node.output[0] if node.output else node.name
            graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for i, sub in enumerate(graphs):
                yield from subgraphs(sub, (*key, (owner, attr.name, i)))


def defined(graph: onnx.GraphProto) -> list[str]:
    """Names ``graph`` itself defines: inputs, initializers, node outputs."""
    names = [v.name for v in graph.input] + [t.name for t in graph.initializer]
    names += [t.values.name for t in graph.sparse_initializer]
    return names + [o for n in graph.node for o in n.output if o]


def unique_names(model: onnx.ModelProto) -> dict[str, str]:
    """Rename, in place, every value a subgraph defines under a name already defined elsewhere in
    the model, so that each name means one value; references follow ONNX's scoping (a name
    resolves to the innermost enclosing graph that defines it). Returns new name -> old name."""
    taken = {n for _, g in subgraphs(model.graph) for n in defined(g)}
    seen: set[str] = set()
    inverse: dict[str, str] = {}
    counter = [0]

    def fresh(name: str) -> str:
        while True:
            counter[0] += 1
            new = f"{name}__sub{counter[0]}"
            if new not in taken:
                taken.add(new)
                inverse[new] = name
                return new

    def walk(graph: onnx.GraphProto, outer: dict[str, str], top: bool) -> None:
        scope = dict(outer)
        for name in dict.fromkeys(defined(graph)):
            scope[name] = fresh(name) if not top and (name in seen or name in outer) else name
            seen.add(name)
        _rename_graph(graph, scope)
        for node in graph.node:
            for attr in node.attribute:
                for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    walk(sub, scope, False)

    walk(model.graph, {}, True)
    return inverse


def rename(model: onnx.ModelProto, mapping: dict[str, str]) -> None:
    """Apply ``mapping`` (old -> new) to every name in every graph of ``model``, in place."""
    if mapping:
        for _, graph in subgraphs(model.graph):
            _rename_graph(graph, mapping)


def _rename_graph(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Rename this graph's own names (not its subgraphs'; those are walked separately)."""
    get = lambda n: mapping.get(n, n) if n else n  # noqa: E731 - "" is an absent optional input
    for values in (graph.input, graph.output, graph.value_info):
        for v in values:
            v.name = get(v.name)
    for t in graph.initializer:
        t.name = get(t.name)
    for t in graph.sparse_initializer:
        t.values.name = get(t.values.name)
    for node in graph.node:
        node.input[:] = [get(n) for n in node.input]
        node.output[:] = [get(n) for n in node.output]


def graph_labels(model: ir.Model) -> dict[ir.Graph, str]:
    """Every graph of ``model`` -> how the report names it: "" for the main graph, else the
    owning node and attribute ("/decoder/If.then_branch"), nested levels joined by " > "."""
    labels: dict[ir.Graph, str] = {model.graph: ""}

    def walk(graph: ir.Graph, label: str) -> None:
        for node in graph:
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    graphs = [attr.value]
                elif attr.type == ir.AttributeType.GRAPHS:
                    graphs = list(attr.value)
                else:
                    continue
                for i, sub in enumerate(graphs):
                    own = f"{node.name or node.op_type}.{attr.name}" + (f"[{i}]" if len(graphs) > 1 else "")
                    labels[sub] = f"{label} > {own}" if label else own
                    walk(sub, labels[sub])

    walk(model.graph, "")
    return labels


def qualified(graph: str, node: str) -> str:
    """A node's name made unique in the model: sibling branches may hold nodes of the same name."""
    return f"{graph} > {node}" if graph else node


def scope_inputs(context) -> list[ir.Value]:
    """The graph inputs a rule's match can read: its own graph's, then the main graph's (a
    subgraph reads the model's inputs from the outer scope)."""
    own = list(context.graph_or_function.inputs)
    return own + [v for v in context.model.graph.inputs if v not in own]
