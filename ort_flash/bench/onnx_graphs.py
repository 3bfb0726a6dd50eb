"""The one-node (or one-subgraph) ONNX models the op-level peers run in ONNX Runtime.

| builder                  | graph                                                                    |
|--------------------------|--------------------------------------------------------------------------|
| ``flash_attention``      | ort_flash.FlashAttention(Q, K, V[, attn_mask, past_key, past_value, nonpad_kv_seqlen]) |
| ``flash_attention_model`` | the same node, every input's and output's element type and rank given (the tests' builder) |
| ``multi_head_attention`` | com.microsoft.MultiHeadAttention(query (B,S,Hq·D), key, value) (3-D BSH, or 4-D BNSH K/V) |
| ``onnx_attention``       | ONNX Attention-23(Q, K, V) on 4-D BNSH                                   |
| ``unfused_attention``    | MatMul(Q, Transpose(K)) → Mul(scale) [→ Add(mask)] → Softmax → MatMul(V): the exporter's graph |
| ``replicate``            | N independent copies of any of these in one graph (the decode suite's layers) |

Every dimension is symbolic so one model serves every shape; IR version 10 (onnxruntime 1.31
loads IR <= 13). GroupQueryAttention's one-node models are ``gqa_graphs``'.
"""
from __future__ import annotations

from onnx import helper

from ort_flash.bench.tensors import ONNX_TYPES

IR_VERSION = 10


def _model(nodes, inputs, outputs, opsets, initializers=()) -> bytes:
    graph = helper.make_graph(nodes, "bench", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = IR_VERSION
    return model.SerializeToString()


def _vi(name, dtype: str, rank: int | None = None, shape=None):
    dims = shape if shape is not None else [f"{name}_{i}" for i in range(rank)]
    return helper.make_tensor_value_info(name, ONNX_TYPES[dtype], dims)


FLASH_INPUTS = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
FLASH_OUTPUTS = ("Y", "present_key", "present_value", "softmax_lse")


def flash_attention_model(inputs: dict[str, tuple[int, int | None]], outputs: dict[str, tuple[int, int | None]],
                          **attrs) -> bytes:
    """A model whose one node is FlashAttention: ``inputs`` / ``outputs`` map the names present
    (FLASH_INPUTS, FLASH_OUTPUTS; absent optional ones become the empty name) to (ONNX element type,
    rank or None: unknown); every dim symbolic; attributes with None are left out."""
    unknown = set(inputs) - set(FLASH_INPUTS) | set(outputs) - set(FLASH_OUTPUTS)
    if unknown:
        raise ValueError(f"unknown input/output names {sorted(unknown)}")
    node_in = [n if n in inputs else "" for n in FLASH_INPUTS]
    node_out = [n if n in outputs else "" for n in FLASH_OUTPUTS]
    while node_in[-1] == "":
        node_in.pop()
    while node_out[-1] == "":
        node_out.pop()
    node = helper.make_node("FlashAttention", node_in, node_out, domain="ort_flash",
                            **{k: v for k, v in attrs.items() if v is not None})

    def vi(name, elem, rank):
        return helper.make_tensor_value_info(name, elem, None if rank is None else [f"{name}_{i}" for i in range(rank)])
    return _model([node], [vi(n, *t) for n, t in inputs.items()], [vi(n, *t) for n, t in outputs.items()],
                  [("ort_flash", 1), ("", 21)])


def flash_attention(dtype: str, inputs: dict[str, int], outputs: dict[str, int], **attrs) -> bytes:
    """``flash_attention_model`` in one dtype: ``inputs`` / ``outputs`` map the names present to
    their rank (nonpad_kv_seqlen int64, softmax_lse float32)."""
    types = {"nonpad_kv_seqlen": "int64", "softmax_lse": "float32"}
    return flash_attention_model({n: (ONNX_TYPES[types.get(n, dtype)], r) for n, r in inputs.items()},
                                 {n: (ONNX_TYPES[types.get(n, dtype)], r) for n, r in outputs.items()}, **attrs)


def multi_head_attention(dtype: str, num_heads: int, causal: bool, kv_rank: int = 3) -> bytes:
    """query (B, S, Hq·D); key/value (B, Skv, H·D) or, with kv_rank 4, (B, H, Skv, D)."""
    node = helper.make_node("MultiHeadAttention", ["query", "key", "value"], ["output"],
                            domain="com.microsoft", num_heads=num_heads, unidirectional=int(causal))
    return _model([node], [_vi("query", dtype, 3), _vi("key", dtype, kv_rank), _vi("value", dtype, kv_rank)],
                  [_vi("output", dtype, 3)], [("com.microsoft", 1), ("", 21)])


def onnx_attention(dtype: str, causal: bool, opset: int = 23) -> bytes:
    node = helper.make_node("Attention", ["Q", "K", "V"], ["Y"], is_causal=int(causal))
    return _model([node], [_vi(n, dtype, 4) for n in ("Q", "K", "V")], [_vi("Y", dtype, 4)],
                  [("", opset)])


def unfused_attention(dtype: str, scale: float, mask: bool) -> bytes:
    """The exporter's attention on 4-D BNSH inputs; ``mask`` adds an additive (B|1, H|1, Sq, Skv) input."""
    c = helper.make_tensor("scale", ONNX_TYPES[dtype], [], [float(scale)])
    nodes = [
        helper.make_node("Transpose", ["K"], ["Kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["Q", "Kt"], ["S"]),
        helper.make_node("Mul", ["S", "scale"], ["Ss"]),
    ]
    last = "Ss"
    inputs = [_vi(n, dtype, 4) for n in ("Q", "K", "V")]
    if mask:
        nodes.append(helper.make_node("Add", ["Ss", "attn_mask"], ["Sm"]))
        inputs.append(_vi("attn_mask", dtype, 4))
        last = "Sm"
    nodes += [helper.make_node("Softmax", [last], ["P"], axis=-1),
              helper.make_node("MatMul", ["P", "V"], ["Y"])]
    return _model(nodes, inputs, [_vi("Y", dtype, 4)], [("", 17)], [c])


def replicate(model: bytes, copies: int) -> bytes:
    """``copies`` independent copies of a model's graph in one model, every input, output and
    intermediate of copy j renamed ``{name}__{j}``: a one-node model becomes ``copies`` nodes that
    run one after another in one session run, as a model's layers do (the decode suite times a
    node's share of such a run, in the same timing class as a torch CUDA graph of many calls)."""
    import onnx

    src = onnx.load_from_string(model)
    g = src.graph
    nodes, inputs, outputs, inits = [], [], [], []
    for j in range(copies):
        def rn(name: str, j=j) -> str:
            return f"{name}__{j}" if name else name
        for i, n in enumerate(g.node):
            c = onnx.NodeProto()
            c.CopyFrom(n)
            c.name = rn(n.name or f"{n.op_type}_{i}")  # unnamed nodes of one op type stay apart
            c.input[:] = [rn(x) for x in n.input]
            c.output[:] = [rn(x) for x in n.output]
            nodes.append(c)
        for vi, dst in ((g.input, inputs), (g.output, outputs)):
            for v in vi:
                c = onnx.ValueInfoProto()
                c.CopyFrom(v)
                c.name = rn(v.name)
                dst.append(c)
        for t in g.initializer:
            c = onnx.TensorProto()
            c.CopyFrom(t)
            c.name = rn(t.name)
            inits.append(c)
    graph = helper.make_graph(nodes, g.name, inputs, outputs, initializer=inits)
    out = helper.make_model(graph, opset_imports=list(src.opset_import))
    out.ir_version = src.ir_version
    return out.SerializeToString()
