"""The mask prover: what an attention mask subgraph computes, proven by abstract evaluation.

``analysis.analyze_mask`` is the entry (the ``causal_mask`` refinement calls it); it runs
``evaluator.Evaluator`` over the mask's producers in the symbolic ``domain`` (affine index
formulas, predicates, two-valued selects), with ``lookups`` (Gather / GatherND / ScatterND of a
mask input), ``combine`` (elementwise ops by truth table) and ``values`` (a mask input's values
as floats). Anything it does not model raises ``Unprovable`` with the reason, and the mask stays.
"""
