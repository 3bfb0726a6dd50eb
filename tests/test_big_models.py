"""Models of any size: external data in and out, past protobuf's 2 GB, with bounded memory;
and models with ONNX Runtime's own ops in the ONNX domain (GenAI's builder).

The big model is lab/models/big_model.py's decoder, built with onnx helpers in seconds. Each command
runs in a child process that reports its own peak RSS (``resource.getrusage``), so the figure is
the command's, not pytest's.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import external_data_helper as edh

from ort_flash.cli import main
from ort_flash.rewriter import external_data

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lab.models import big_model  # noqa: E402

try:
    import ort_flash

    ort_flash.library_path()
    HAVE_LIBRARY = True
except (OSError, FileNotFoundError):
    HAVE_LIBRARY = False
needs_library = pytest.mark.skipif(not HAVE_LIBRARY, reason="ort_flash's library is not built")

# The child: runs the CLI, then prints {"rc": ..., "peak_bytes": ...} as its last stdout line.
CHILD = """
import json, resource, sys
from ort_flash.cli import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def run_cli(*argv: str) -> tuple[int, int, str, str]:
    """(exit status, peak RSS in bytes, stdout, stderr) of ``ort-flash ARGV`` in a child."""
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True,
                          timeout=900)
    last = json.loads(done.stdout.strip().splitlines()[-1])
    return last["rc"], last["peak_bytes"], done.stdout, done.stderr


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def tensor_digests(model_path: Path) -> dict[str, str]:
    """name -> sha256 of each initializer's bytes (external ones read in chunks)."""
    model = onnx.load(model_path, load_external_data=False)
    folder = model_path.parent
    out = {}
    for t in model.graph.initializer:
        h = hashlib.sha256()
        if edh.uses_external_data(t):
            info = edh.ExternalDataInfo(t)
            with open(folder / info.location, "rb") as f:
                f.seek(info.offset or 0)
                left = info.length
                while left:
                    chunk = f.read(min(left, 16 << 20))
                    h.update(chunk)
                    left -= len(chunk)
        else:
            h.update(onnx.numpy_helper.to_array(t).tobytes())
        out[t.name] = h.hexdigest()
    return out


def locations(model_path: Path) -> set[str]:
    model = onnx.load(model_path, load_external_data=False)
    return {edh.ExternalDataInfo(t).location for t in external_data.external_tensors(model)}


@needs_library
def test_genai_ops_in_the_onnx_domain_load_rewrite_and_verify(tmp_path):
    """SimplifiedLayerNormalization (domain "", as GenAI writes it) and com.microsoft.Gelu:
    onnx.checker refuses the model, ONNX Runtime runs it, so ort-flash takes it."""
    source = big_model.build(str(tmp_path / "in"), 2, hidden=128, heads=2, ffn=256, genai_ops=True)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(source)
    out = tmp_path / "out" / "model.flash.onnx"
    out.parent.mkdir()
    assert main(["rewrite", source, "-o", str(out)]) == 0
    assert main(["verify", source, str(out), "--seed", "0"]) == 0


@needs_library
def test_small_external_model_keeps_external_data_in_another_folder(tmp_path, capsys):
    """Input with external data -> output with its own data file, usable after the input goes."""
    source = Path(big_model.build(str(tmp_path / "in"), 2, hidden=128, heads=2, ffn=256))
    before = {p.name: sha256(p) for p in source.parent.iterdir()}
    out = tmp_path / "out" / "m.flash.onnx"
    out.parent.mkdir()
    assert main(["rewrite", str(source), "-o", str(out)]) == 0
    assert "external data" in capsys.readouterr().out
    assert sorted(os.listdir(out.parent)) == ["m.flash.onnx", "m.flash.onnx.data"]
    assert locations(out) <= {"m.flash.onnx.data"}
    assert {p.name: sha256(p) for p in source.parent.iterdir()} == before
    want, got = tensor_digests(source), tensor_digests(out)
    assert {k: v for k, v in got.items() if k in want} == {k: want[k] for k in got if k in want}
    assert main(["verify", str(source), str(out), "--seed", "0"]) == 0
    for p in source.parent.iterdir():  # the output stands on its own
        p.unlink()
    import onnxruntime as ort
    ort.InferenceSession(str(out), ort_flash.session_options(), providers=["CPUExecutionProvider"])


@needs_library
def test_single_file_output_past_the_limit_is_written_with_external_data(tmp_path, monkeypatch, capsys):
    """A one-file input whose output would pass 2 GB gets a data file, and rewrite says so (the
    limit lowered here, so that a small model stands for a big one)."""
    source = Path(big_model.build(str(tmp_path / "in"), 2, hidden=128, heads=2, ffn=256))
    embedded = tmp_path / "one.onnx"
    onnx.save_model(onnx.load(source), embedded)
    monkeypatch.setattr(external_data, "PROTOBUF_LIMIT", (1 << 20) + (16 << 20))
    out = tmp_path / "one.flash.onnx"
    assert main(["rewrite", str(embedded), "-o", str(out)]) == 0
    assert "2 GB limit" in capsys.readouterr().out
    assert (tmp_path / "one.flash.onnx.data").is_file()
    monkeypatch.undo()
    assert main(["verify", str(embedded), str(out), "--seed", "0"]) == 0


@needs_library
def test_any_failure_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from ort_flash.cli import rewrite_command

    def boom(*args, **kwargs):
        raise RuntimeError("something unexpected\nsecond line")

    source = big_model.build(str(tmp_path / "in"), 1, hidden=64, heads=1, ffn=64)
    monkeypatch.setattr(rewrite_command, "write_model", boom)
    assert main(["rewrite", source, "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ort-flash: error: ") and "Traceback" not in err


@pytest.mark.slow
@needs_library
def test_model_past_2gb_rewrites_and_verifies_in_bounded_memory(tmp_path):
    """A 2.2 GB fp32 decoder (external data): rewrite and verify succeed, each with peak RSS
    <= 1 GB + 1.2 x the weights; the output is a small graph plus one data file in its own
    folder, weights bit-identical, inputs untouched."""
    layers = big_model.layers_for(2.2)
    source = Path(big_model.build(str(tmp_path / "in"), layers))
    weights = os.path.getsize(source.parent / "model.onnx.data")
    assert weights > 2**31
    before = {p.name: sha256(p) for p in source.parent.iterdir()}
    budget = (1 << 30) + 1.2 * weights
    out = tmp_path / "out" / "big.flash.onnx"
    out.parent.mkdir()
    try:
        rc, peak, stdout, stderr = run_cli("rewrite", str(source), "-o", str(out))
        assert rc == 0, stderr
        assert stderr == ""  # not a terminal: no progress
        assert f"fused attention subgraphs: {layers}" in stdout
        assert peak <= budget, (peak, budget)
        assert sorted(os.listdir(out.parent)) == ["big.flash.onnx", "big.flash.onnx.data"]
        assert os.path.getsize(out) < 16 << 20
        assert os.path.getsize(str(out) + ".data") < 2 * weights
        assert locations(out) == {"big.flash.onnx.data"}
        want, got = tensor_digests(source), tensor_digests(out)
        kept = [k for k in got if k in want]
        assert len(kept) >= 3 * layers  # wo, w1, w2 of every layer at least
        assert all(got[k] == want[k] for k in kept)

        rc, peak, stdout, stderr = run_cli("verify", str(source), str(out), "--seed", "0",
                                           "--seq-len", "16")
        assert rc == 0, stdout + stderr
        assert "PASS" in stdout
        assert peak <= budget, (peak, budget)
        assert {p.name: sha256(p) for p in source.parent.iterdir()} == before
    finally:
        for folder in (source.parent, out.parent):
            for p in folder.iterdir():
                p.unlink()


# ONNX Runtime alone on a model, as verify runs the original (optimizations off, no prepacking):
# one session and one run; prints its peak RSS in bytes.
ORT_ALONE = """
import json, resource, sys
import onnx, onnxruntime as ort
from ort_flash.feeds import make_inputs
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
so.add_session_config_entry("session.disable_prepacking", "1")
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
s.run(None, make_inputs(onnx.load(sys.argv[1], load_external_data=False), batch=2, seq_len=16, seed=0))
print(json.dumps({"peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


@pytest.mark.slow
@needs_library
def test_fp16_verify_costs_onnxruntimes_own_memory(tmp_path):
    """On the CPU, ONNX Runtime holds float32 copies of a float16 model's weights while it runs
    it; verify must cost that once, not keep the original's memory while the rewritten model
    loads (an output array of the first session kept its arena alive: 1.4x ORT's own peak)."""
    source = Path(big_model.build(str(tmp_path / "in"), big_model.layers_for(0.5, itemsize=2), float16=True))
    out = tmp_path / "out" / "flash.onnx"
    out.parent.mkdir()
    rc, _, stdout, stderr = run_cli("rewrite", str(source), "-o", str(out))
    assert rc == 0, stderr
    alone = subprocess.run([sys.executable, "-c", ORT_ALONE, str(source)], capture_output=True, text=True,
                           timeout=600)
    assert alone.returncode == 0, alone.stderr
    ort_peak = json.loads(alone.stdout.strip().splitlines()[-1])["peak_bytes"]
    rc, peak, stdout, stderr = run_cli("verify", str(source), str(out), "--seed", "0", "--seq-len", "16")
    assert rc == 0, stdout + stderr
    assert peak <= 1.1 * ort_peak + (200 << 20), (peak, ort_peak)
