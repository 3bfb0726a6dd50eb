"""`ort-flash bench`: the fused op against ONNX Runtime's attention, the unfused graph and torch
SDPA, measured in one run on one machine; tables on the terminal, JSON on disk, and
docs/PERFORMANCE.md (``ort_flash.bench.report``).

| suite      | what                                                                                 |
|------------|--------------------------------------------------------------------------------------|
| op         | one attention call, prefill shapes (16k tokens, hidden 2048): TFLOP/s vs peers        |
| decode     | Sq 1 / 4 against a long KV cache (Hq 32, Hkv 8, d 128): KV read bandwidth vs peers   |
| e2e        | BERT / GPT-2 / LLaMA-style models: latency and peak memory, original vs rewritten vs ORT optimizer |
| decode_e2e | the LLaMA-style model's decoding step against a KV cache: step latency, the same three variants |
| cpu        | CPU EP, fp32: the fused CPU op vs ORT MHA and the unfused graph, latency and peak RSS |

The command itself (its arguments, a child process per suite) is ``ort_flash/cli/bench_command.py``.
Files: ``suites`` (one suite in-process), ``*_suite``
(grids and tables), ``*_peers`` / ``torch_calls`` / ``ort_session`` / ``onnx_graphs`` (what is
timed), ``timers``, ``tensors``, ``spot_check``, ``measure``, ``workload`` (FLOP and byte counts),
``ceilings``, ``environment``, ``results`` (the JSON schema), ``tables``, ``report``.
"""
