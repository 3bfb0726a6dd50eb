"""Fusions: the rules that create an ``ort_flash.FlashAttention`` (or ``ort_flash.GroupQueryAttention``)
node from what an exporter wrote. One rule per file, each opening with the subgraph it matches:

- ``sdpa_attention``: torch's decomposition of F.scaled_dot_product_attention (a subclass of
  ``matmul_softmax_attention`` with the scale split over Q and Kᵀ);
- ``matmul_softmax_attention``: eager attention, MatMul → scale → mask → Softmax → MatMul;
- ``onnx_attention``: ONNX Attention (opset 23-25), one to one;
- ``ms_multihead_attention``: ONNX Runtime's com.microsoft.MultiHeadAttention;
- ``group_query_attention``: ONNX Runtime's com.microsoft.GroupQueryAttention, swapped for
  ort_flash's op of the same interface.

The parts of the eager rule, each named by the form it accepts: ``masked_fill`` (Where(keep, S, c)),
``score_casts`` (Casts in the score chain), ``view_3d`` / ``view_4d`` (attention on (B·H, S, D)
views). ``node_rule`` is the base of the three rules that map one node.

A fused node takes its mask as the model computed it; the refinements (``../refinements``)
then prove cheaper forms. The order the rules are tried in is ``pipeline.FUSIONS``.
"""
