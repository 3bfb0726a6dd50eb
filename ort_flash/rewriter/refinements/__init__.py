"""Refinements: the rules that prove a cheaper form of a FlashAttention node a fusion made, and
re-emit it under the same name. One rule per file, each opening with the subgraph it rewrites;
``base.Refinement`` is their base (the node, its outputs in use, the decline records). In the
order ``pipeline.REFINEMENTS`` runs them:

- ``repeat_kv``: K/V keep their Hkv heads (GQA's repeat absorbed);
- ``kv_cache``: a KV cache's Concat(past, new) becomes the op's past/present inputs and outputs;
- ``causal_mask``: a materialized causal / padding mask becomes is_causal and a (B, 1, 1, S)
  mask, where the mask prover (``../mask_prover``) proves it;
- ``layout_3d``: the head split/merge Transposes become the op's 3-D layout;
- ``packed_qkv``: self-attention's three projections become one MatMul read as packed QKV;
- ``bias_fold``: a packed QKV's K and V biases leave the attention's input;
- ``merge_reshape``: Reshapes after the node that give back its Y's shape go.

``head_shapes`` (before ``repeat_kv`` and ``layout_3d``) and ``kv_cache``'s ``ConcatShape``
rewrite the Shape reads that would keep a replaced chain alive.
"""
