"""What `ort-flash info` prints: the library, ONNX Runtime, the compiled kernels, this GPU."""
from __future__ import annotations

import collections

from ort_flash._cuda_device import cuda_device_arch


CPU_ONLY = ("kernels:      none: this is a CPU-only build (ORT_FLASH_CUDA_ARCHS was empty), so no "
            "CUDA kernels are compiled and the op runs on ONNX Runtime's CPU execution provider "
            "only; to compile them, reinstall with the default archs (`pip install .`: sm_80 and "
            "sm_90) or name yours, e.g. `ORT_FLASH_CUDA_ARCHS=\"80;90\" pip install .`.")


def onnxruntime_line() -> str:
    """The installed ONNX Runtime and its providers, or (first) what is wrong with it and what to do."""
    from ort_flash._onnxruntime import problem

    trouble = problem()
    lines = [f"onnxruntime:  PROBLEM: {trouble.removeprefix('ort_flash: ')}"] if trouble else []
    try:
        import onnxruntime as ort
    except ImportError:
        return lines[0]
    lines.append(f"onnxruntime:  {ort.__version__} (providers: {', '.join(ort.get_available_providers())})")
    return "\n".join(lines)


def format_info() -> str:
    import ort_flash
    from ort_flash._library import load_extension

    _C = load_extension()  # a clear error where a source checkout shadows the install
    kernels = _C.kernels()
    archs = sorted({k["arch"] for k in kernels})
    lines = [
        f"ort_flash {ort_flash.__version__}",
        f"library:      {ort_flash.library_path()}",
        onnxruntime_line(),
        f"kernels:      {len(kernels)} AOT cubins from Triton {_C.triton_version()} for "
        + ", ".join(f"sm_{a}" for a in archs) if kernels else CPU_ONLY,
    ]
    groups = collections.defaultdict(set)
    decode = collections.defaultdict(set)
    tma = collections.defaultdict(set)
    keys = collections.defaultdict(set)
    fp8 = collections.defaultdict(set)
    for k in kernels:
        if k.get("mask_keys"):
            keys[k["dtype"]].add(k["head_dim"])
        if k.get("kind", "fwd") != "fwd":
            if k["kind"] == "decode":
                decode[k["dtype"]].add(k["head_dim"])
            elif k["kind"] == "fwd_tma" and not k.get("mask_keys"):
                tma[(k["dtype"], k["arch"])].add(k["head_dim"])
            elif k["kind"] == "fwd_fp8":
                fp8[(k["dtype"], k["arch"])].add(k["head_dim"])
            continue
        name = k["dtype"] + (f" ({k['precision']} dots)" if k["dtype"] == "float32" else "")
        groups[name].add(k["head_dim"])
    for name, dims in sorted(groups.items()):
        lines.append(f"  {name:22s} head dims up to {', '.join(map(str, sorted(dims)))}; "
                     "causal or not, no/bool/additive mask, windows, softcap, nonpad_kv_seqlen")
    for (name, arch), dims in sorted(tma.items()):
        lines.append(f"  {name:22s} TMA tensor descriptors on sm_{arch} for head dims "
                     f"{', '.join(map(str, sorted(dims)))}, a tile per causal flag and sequence length "
                     "(16-byte aligned views; ORT_FLASH_TMA=0 turns them off)")
    for (name, arch), dims in sorted(fp8.items()):
        lines.append(f"  {name:22s} FP8 (e4m3) prefill on sm_{arch} for head dims {', '.join(map(str, sorted(dims)))}, "
                     "opt-in (rewrite --attention-precision fp8): no KV cache, mask, window or softcap")
    for name, dims in sorted(keys.items()):
        lines.append(f"  {name:22s} key-vector masks ((B, 1, 1, S) padding: query stride 0) read once per key "
                     f"block for head dims {', '.join(map(str, sorted(dims)))} (TMA too on sm_90)")
    for name, dims in sorted(decode.items()):
        lines.append(f"  {name:22s} split-KV decode (Sq <= 16, GQA group x Sq <= 64) for head dims up to "
                     f"{', '.join(map(str, sorted(dims)))}")
    dev = cuda_device_arch()
    if dev is None:
        lines.append("GPU:          none found (the CPU execution provider runs the op)")
    else:
        arch, name = dev
        same_major = [a for a in archs if a // 10 == arch // 10 and a <= arch]
        verdict = (f"supported (runs the sm_{max(same_major)} kernels)" if same_major
                   else f"NOT supported by this build: rebuild with ORT_FLASH_CUDA_ARCHS including {arch}")
        lines.append(f"GPU:          {name}, sm_{arch}: {verdict}")
    return "\n".join(lines)
