"""PNG plots of benchmark results (matplotlib, Agg backend: no display needed).

Each function takes one suite's result dict and a path, draws one figure, and returns the path
(or None when the suite has nothing to draw)."""
from __future__ import annotations

import pathlib

STYLE = {"ort_flash": dict(color="C3", lw=2.5, marker="o"), "ort_flash_kernel": dict(color="C3", ls="--", marker="."),
         "ort_flash_past": dict(color="C1", ls="--", marker="."), "original": dict(color="C7", marker="s"),
         "ort_optimizer": dict(color="C0", marker="^"), "ort_flash_opt": dict(color="C3", ls=":", lw=2, marker="D")}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _series(rows, x_key, y_key, where) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list] = {}
    for r in rows:
        if r.get("status") == "ok" and y_key in r and where(r["config"]):
            out.setdefault(r["peer"], []).append((r["config"][x_key], r[y_key]))
    return {k: sorted(v) for k, v in out.items()}


def _panel(ax, series, title, xlabel, ylabel, logy=False):
    for peer, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=peer, **STYLE.get(peer, {"marker": "."}))
    from matplotlib.ticker import ScalarFormatter
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=7)


def _save(fig, axes, path) -> pathlib.Path:
    handles = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(list(handles.values()), list(handles.keys()), loc="lower center", ncol=min(4, len(handles)),
               fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def op_tflops(suite: dict, dtype: str, path) -> pathlib.Path | None:
    """TFLOP/s against seqlen, one panel per (head dim, causal), one line per peer."""
    rows = [r for r in suite["rows"] if r["config"]["dtype"] == dtype]
    panels = sorted({(r["config"]["d"], r["config"]["causal"]) for r in rows})
    if not panels:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6), squeeze=False)
    for ax, (d, causal) in zip(axes[0], panels):
        s = _series(rows, "seqlen", "tflops", lambda c: c["d"] == d and c["causal"] == causal)
        _panel(ax, s, f"{dtype} d{d}{' causal' if causal else ''}", "sequence length", "TFLOP/s")
    return _save(fig, axes[0], path)


def decode_bandwidth(suite: dict, path) -> pathlib.Path | None:
    """KV read TB/s against cache length, one panel per (batch, Sq)."""
    rows = suite["rows"]
    panels = sorted({(r["config"]["batch"], r["config"]["sq"]) for r in rows})
    panels = [p for p in panels if len({r["config"]["cache"] for r in rows
                                        if (r["config"]["batch"], r["config"]["sq"]) == p}) > 1] or panels
    if not panels:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.5), squeeze=False)
    for ax, (b, sq) in zip(axes[0], panels):
        s = _series(rows, "cache", "kv_tbps", lambda c: c["batch"] == b and c["sq"] == sq)
        _panel(ax, s, f"B{b} Sq{sq}", "KV cache length", "KV read TB/s")
    return _save(fig, axes[0], path)


def e2e(suite: dict, key: str, ylabel: str, path) -> pathlib.Path | None:
    """Latency (key "ms") or memory ("peak_mb") against sequence length, a panel per model."""
    models = list(dict.fromkeys(r["config"]["model"] for r in suite["rows"]))
    if not models:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(models), figsize=(3.8 * len(models), 3.6), squeeze=False)
    for ax, model in zip(axes[0], models):
        s = _series(suite["rows"], "seqlen", key, lambda c: c["model"] == model)
        layers = next(r["config"]["layers"] for r in suite["rows"] if r["config"]["model"] == model)
        _panel(ax, s, f"{model} ({layers} layers)", "sequence length", ylabel, logy=True)
    return _save(fig, axes[0], path)


def decode_e2e(suite: dict, path) -> pathlib.Path | None:
    """Decode-step latency against the past length, a panel per (model, batch)."""
    rows = suite["rows"]
    panels = list(dict.fromkeys((r["config"]["model"], r["config"]["layers"], r["config"]["batch"]) for r in rows))
    if not panels:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.6), squeeze=False)
    for ax, (model, layers, b) in zip(axes[0], panels):
        s = _series(rows, "past", "ms", lambda c: (c["model"], c["batch"]) == (model, b))
        _panel(ax, s, f"{model} ({layers} layers) B{b}", "past (KV cache) length", "ms per step (median)", logy=True)
    return _save(fig, axes[0], path)


def cpu(suite: dict, path) -> pathlib.Path | None:
    """Latency and extra memory against N (non-causal and causal)."""
    rows = suite["rows"]
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.6), squeeze=False)
    for i, causal in enumerate((False, True)):
        tag = " causal" if causal else ""
        _panel(axes[0][i], _series(rows, "seqlen", "ms", lambda c: c["causal"] == causal),
               f"latency{tag}", "N", "ms", logy=True)
        _panel(axes[0][2 + i], _series(rows, "seqlen", "work_mb", lambda c: c["causal"] == causal),
               f"extra peak RSS{tag}", "N", "MB", logy=True)
    return _save(fig, axes[0], path)


def draw_all(suites: dict[str, dict], out_dir) -> dict[str, pathlib.Path]:
    """Every plot the suites allow: {name: path}."""
    out_dir = pathlib.Path(out_dir)
    made = {}
    op = suites.get("op")
    if op:
        for dtype in dict.fromkeys(r["config"]["dtype"] for r in op["rows"]):
            made[f"op_{dtype}"] = op_tflops(op, dtype, out_dir / f"op_tflops_{dtype}.png")
    if suites.get("decode"):
        made["decode"] = decode_bandwidth(suites["decode"], out_dir / "decode_bandwidth.png")
    if suites.get("e2e"):
        made["e2e_latency"] = e2e(suites["e2e"], "ms", "ms (median)", out_dir / "e2e_latency.png")
        made["e2e_memory"] = e2e(suites["e2e"], "peak_mb", "peak MB", out_dir / "e2e_memory.png")
    if suites.get("decode_e2e"):
        made["decode_e2e"] = decode_e2e(suites["decode_e2e"], out_dir / "decode_e2e_latency.png")
    if suites.get("cpu"):
        made["cpu"] = cpu(suites["cpu"], out_dir / "cpu.png")
    return {k: v for k, v in made.items() if v is not None}

