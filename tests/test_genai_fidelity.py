"""The teacher-forced fidelity check (ort_flash.bench.genai_fidelity): the original's greedy tokens
fed to the original and the rewritten GenAI folder, logits compared at every step against a
rounding bound measured from the models' own prefill.

On the CPU EP with GenAI builder families; the check must pass on the rewritten folders, batch 1
and a padded batch of two, and must fail on a rewritten folder whose new tokens get the wrong
rotary position (a decode-path error that leaves the prompt's logits alone). The builder's other
decoders (partial and interleaved rotary, the rotary outside the attention, MRoPE, convolution and
linear-attention layers, attention multipliers, LongRoPE) are rewritten with every node mapped and
checked the same way. On CUDA (marked gpu):
a float16 and a bfloat16 LLaMA-shaped model at head sizes 64 and 128, built by GenAI's builder.
Without GenAI: the arithmetic of the comparison, and the GenAI drivers' teacher-forced stepping
(genai_e2e.Runner's) over a stand-in for onnxruntime_genai that records every call.
"""
from __future__ import annotations

import json
import shutil
import sys
import types

import numpy as np
import pytest

from ort_flash import genai
from ort_flash.bench import genai_e2e, genai_fidelity as fid

try:
    import onnxruntime_genai  # noqa: F401
    HAS_GENAI = True
except ImportError:
    HAS_GENAI = False

STEPS = 24


def _genai(test):
    """A test of real GenAI folders: needs onnxruntime-genai; slow (GenAI builder runs on a cold
    cache)."""
    skip = pytest.mark.skipif(not HAS_GENAI, reason="onnxruntime_genai (onnxruntime-genai) is not installed")
    return pytest.mark.slow(skip(test))


def _rewritten(folder, tmp_path_factory, name):
    out = tmp_path_factory.mktemp(name) / "model"
    info = genai_e2e.rewrite_folder(folder, out)
    layers = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["num_hidden_layers"]
    assert info["fused"] == layers, info
    return out


@pytest.fixture(scope="module", params=["llama", "phi3", "gemma2-fullkv"])
def pair(request, tmp_path_factory):
    from lab.models.genai_family import build

    folder = build(request.param)
    return request.param, folder, _rewritten(folder, tmp_path_factory, request.param)


def _drivers(kind, original, rewritten):
    return {v: fid.DRIVERS[kind](f, "cpu") for v, f in (("original", original), ("ort_flash", rewritten))}


@_genai
@pytest.mark.parametrize("batch,driver", [(1, "genai"), (1, "genai_rewind"), (1, "session"), (2, "session")])
def test_rewritten_folder_within_rounding_every_step(pair, batch, driver):
    _, original, rewritten = pair
    rows = fid.prompt_rows(np.random.default_rng(7), 37, batch, vocab=60)
    s = fid.check(_drivers(driver, original, rewritten), fid.SessionDriver(original, "cpu"), rows, STEPS, "float32")
    assert s["steps"] == STEPS and len(s["per_step"]) == STEPS + 1
    assert s["prompt_lengths"] == ([37] if batch == 1 else [37, 27])
    assert s["passed"], {k: s[k] for k in ("steps_over_bound", "unexplained", "worst_diff_over_bound")}
    assert s["max_diff"] > 0  # two implementations: not the same bits
    assert s["min_bound"] > 0


@_genai
@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_window_sized_cache_within_rounding_every_step(family, tmp_path_factory):
    """A family whose windowed layers keep a window-sized KV cache (sliding_window_cache=1, the
    builder's default): the session driver finds those layers and gives them buffers of the
    window's length (the others max_length), the prompt and the steps run past the window (the
    cache compacts), and the rewritten folder stays within rounding, batch 1 and a batch of two
    rows of one length (a window-sized cache takes no padding)."""
    from lab.models.genai_family import WINDOW, build

    original = build(family)
    rewritten = _rewritten(original, tmp_path_factory, f"{family}-windowed")
    reference = fid.SessionDriver(original, "cpu")
    layers = reference.cfg["layers"]
    windowed = [i for i in range(layers) if i in reference.windows]
    assert windowed and set(reference.windows.values()) == {WINDOW}
    assert fid.SessionDriver(rewritten, "cpu").windows == reference.windows
    lengths = [b.shape[2] for b in reference.buffers(1, 100)]
    assert lengths == [WINDOW if i // 2 in windowed else 100 for i in range(2 * layers)]
    rng = np.random.default_rng(11)
    prompt = WINDOW + 5
    for batch in (1, 2):
        rows = [rng.integers(3, 60, prompt).astype(np.int32) for _ in range(batch)]
        s = fid.check(_drivers("session", original, rewritten), reference, rows, STEPS, "float32")
        assert s["steps"] == STEPS and s["prompt_lengths"] == [prompt] * batch
        assert s["passed"], {k: s[k] for k in ("steps_over_bound", "unexplained", "worst_diff_over_bound")}
        assert s["max_diff"] > 0


@_genai
def test_gptoss_sinks_and_windows_within_rounding_every_step(tmp_path_factory):
    """gpt-oss as GenAI's builder writes it: attention sinks (head_sink) on every layer, a window
    with a window-sized KV cache on the even layers, experts as one com.microsoft MoE op. Every
    GroupQueryAttention becomes ort_flash's with its sinks kept, and the rewritten folder follows
    the original within rounding, through GenAI (batch 1) and the session driver (batch 1, and two
    rows of one length: a window-sized cache takes no padding). The bound takes in the prompt
    step's difference, so a folder without sinks passes it; float32's own limit (1e-4) catches it."""
    import onnx

    from lab.models.genai_family import WINDOW, build

    original = build("gptoss")
    rewritten = _rewritten(original, tmp_path_factory, "gptoss")
    decoder = rewritten / genai.open_folder(rewritten).decoder.name
    model = onnx.load(str(decoder), load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert {n.domain for n in nodes} == {"ort_flash"}
    assert all(len(n.input) > 11 and n.input[11] in initializers for n in nodes), "a node lost its head_sink"
    assert any(n.op_type == "MoE" for n in model.graph.node)
    reference = fid.SessionDriver(original, "cpu")
    assert reference.windows == {0: WINDOW}  # sliding layers 0, 2, ...; layer 1 is full
    assert fid.SessionDriver(rewritten, "cpu").windows == reference.windows
    rng = np.random.default_rng(13)
    prompt = WINDOW + 5
    for batch, driver in ((1, "genai"), (1, "session"), (2, "session")):
        rows = [rng.integers(3, 60, prompt).astype(np.int32) for _ in range(batch)]
        s = fid.check(_drivers(driver, original, rewritten), reference, rows, STEPS, "float32")
        assert s["steps"] == STEPS and s["prompt_lengths"] == [prompt] * batch
        assert s["passed"], {k: s[k] for k in ("steps_over_bound", "unexplained", "worst_diff_over_bound")}
        assert 0 < s["max_diff"] < 1e-4, s["max_diff"]

    sinkless = tmp_path_factory.mktemp("gptoss-sinkless") / "model"
    shutil.copytree(rewritten, sinkless)
    for n in nodes:
        n.input[11] = ""
    onnx.save(model, str(sinkless / decoder.name))
    s = fid.check(_drivers("session", original, sinkless), reference, rows[:1], 4, "float32")
    assert s["max_diff"] > 1e-2, s["max_diff"]


# The builder's other text decoders (lab.models.genai_family.EXTRA) that it builds here. It refuses
# the rest: gemma3 "KeyError: 'rope_type'" (its make_rope_init reads rope_parameters["rope_type"];
# transformers 5 keeps one rope_parameters per layer type), smollm3 "KeyError: 'position_ids'" (a
# NoPE layer takes the rotary out of GroupQueryAttention, whose fused rotary had dropped the
# position_ids input, and asks for a RotaryEmbedding), phimoe "NotImplementedError: The longrope
# RoPE style is not currently supported." (Phi3MoELongRoPEModel reads no LongRoPE factors), gemma4
# and gemma4_unified "AmbiguousGlobalPerLayerAttributeError: 'head_dim' is a per-layer attribute"
# (the builder reads config.head_dim, global_head_dim and num_global_key_value_heads; transformers
# 5.25's Gemma 4 configs keep the full layers' head size in per_layer_config and drop the other two).
# It builds qwen3_5_moe, mistral3, qwen2_5_vl, qwen3_vl and lfm2_vl too, every node mapped and within
# rounding, batch 1 and 2 (max diff <= 4.5e-7); they stay out of this list for CI's time (about
# 10 s each from a cold cache; their attention is qwen3_5's, mistral's, hunyuan's with MRoPE, or
# lfm2's).
EXTRA_BUILT = ("ernie4_5", "gemma", "granite", "granitemoehybrid", "hunyuan", "lfm2", "lfm2_moe", "nemotron",
               "olmo", "phi", "phi3-longrope", "qwen3_5")


@pytest.fixture(scope="module")
def extra_builds(request):
    """family -> future of its folder, for the families this run selected (a run of a few builds
    those few): builder runs are subprocesses, two at a time (CI's cores)."""
    from concurrent.futures import ThreadPoolExecutor

    from lab.models.genai_family import build

    selected = {item.callspec.params["family"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_builder_family_rewritten_within_rounding"}
    with ThreadPoolExecutor(2) as pool:
        yield {family: pool.submit(build, family) for family in EXTRA_BUILT if family in selected}


@_genai
@pytest.mark.parametrize("family", EXTRA_BUILT)
def test_builder_family_rewritten_within_rounding(family, extra_builds, tmp_path_factory):
    """Each of the builder's other decoders as it writes them (partial or interleaved rotary, the
    rotary outside the attention with Q/K norms after it, convolution layers without a KV cache,
    attention multipliers, LongRoPE's two tables, Qwen 3.5's linear-attention layers with their
    recurrent states and its gated attention with MRoPE outside it): every GroupQueryAttention
    becomes ort_flash's and the rewritten folder follows the original within rounding through the
    session driver, batch 1 and two rows of one length (a convolution or recurrent state takes no
    padding); Phi-3's LongRoPE past its original length too, where the long table is the one in use."""
    import onnx

    original = extra_builds[family].result()
    rewritten = tmp_path_factory.mktemp(family) / "model"
    info = genai_e2e.rewrite_folder(original, rewritten)
    decoder = genai.open_folder(original).decoder.name
    graphs = [onnx.load(str(f / decoder), load_external_data=False).graph for f in (original, rewritten)]
    before, after = ([n for n in g.node if n.op_type == "GroupQueryAttention"] for g in graphs)
    assert before and info["fused"] == len(before) == len(after), info
    assert {n.domain for n in after} == {"ort_flash"}
    reference = fid.SessionDriver(original, "cpu")
    rng = np.random.default_rng(17)
    for prompt in (13, 260) if family == "phi3-longrope" else (13,):  # original_max_position_embeddings 256
        for batch in (1, 2):
            rows = [rng.integers(3, 60, prompt).astype(np.int32) for _ in range(batch)]
            s = fid.check(_drivers("session", original, rewritten), reference, rows, 8, "float32")
            assert s["passed"], {k: s[k] for k in ("steps_over_bound", "unexplained", "worst_diff_over_bound")}
            assert 0 < s["max_diff"] < 1e-4, s["max_diff"]


@_genai
def test_session_driver_feeds_mrope_and_recurrent_states_as_genai_does(extra_builds):
    """Qwen 3.5's decoder asks for 3-D position_ids (MRoPE's time, height and width) and keeps a
    convolution and a recurrent state for its linear-attention layer: fed by the session driver, it
    gives GenAI's own logits at every step (batch 1)."""
    from lab.models.genai_family import build

    future = extra_builds.get("qwen3_5")
    original = future.result() if future else build("qwen3_5")
    session = fid.SessionDriver(original, "cpu")
    assert session.mrope and [s[0] for s in session.states] == ["past.0.conv", "past.0.recurrent"]
    rows = [np.random.default_rng(3).integers(3, 60, 13).astype(np.int32)]
    through_genai, fed = fid.teacher_forced({"original": fid.GenAIDriver(original, "cpu")}, rows, 8)
    alone, fed_alone = fid.teacher_forced({"original": session}, rows, 8)
    np.testing.assert_array_equal(fed, fed_alone)
    np.testing.assert_allclose(alone["original"], through_genai["original"], rtol=0, atol=1e-5)


@_genai
def test_session_driver_feeds_as_genai_does(pair):
    """The session driver is GenAI's feeding: batch 1 through it gives GenAI's own logits at every
    step, and row b of a padded batch gives what its prompt alone gives."""
    _, original, _ = pair
    rows = fid.prompt_rows(np.random.default_rng(3), 29, 2, vocab=60)
    genai, fed = fid.teacher_forced({"original": fid.GenAIDriver(original, "cpu")}, rows[1:], 8)
    alone, fed_alone = fid.teacher_forced({"original": fid.SessionDriver(original, "cpu")}, rows[1:], 8)
    np.testing.assert_array_equal(fed, fed_alone)
    np.testing.assert_allclose(alone["original"], genai["original"], rtol=0, atol=1e-5)
    both, fed_both = fid.teacher_forced({"original": fid.SessionDriver(original, "cpu")}, rows, 8)
    np.testing.assert_array_equal(fed_both[:, 1], fed_alone[:, 0])
    np.testing.assert_allclose(both["original"][:, 1], alone["original"][:, 0], rtol=0, atol=1e-5)


@_genai
def test_check_fails_on_a_wrong_rotary_position_of_new_tokens(tmp_path_factory):
    """A decode-path error the prompt never sees: in the rewritten folder, the rotary tables' rows
    from the prompt's length on are the row before them, so every fed token is rotated as if it
    sat at the prompt's last position. The prompt step passes, later steps leave the bound."""
    from lab.models.genai_family import build

    original = build("llama")
    rewritten = _rewritten(original, tmp_path_factory, "llama-bad-rotary")
    prompt = 31
    _corrupt_rotary_from(rewritten, prompt)
    rows = fid.prompt_rows(np.random.default_rng(5), prompt, 1, vocab=60)
    s = fid.check(_drivers("session", original, rewritten), fid.SessionDriver(original, "cpu"), rows, 12, "float32")
    assert not s["passed"]
    assert s["per_step"][0]["within"], s["per_step"][0]
    assert s["steps_over_bound"] and s["steps_over_bound"][0] >= 1
    assert s["worst_diff_over_bound"] > 10


def test_compare_defines_ties_and_unexplained_flips():
    """Pure arithmetic of compare(): the bound is twice the larger of the original's decode-prefill
    difference and the prompt step's difference; a flip where the original's margin is below the
    bound is a tie, above it unexplained."""
    base = np.zeros((2, 1, 5), np.float32)
    base[:, 0, 0], base[:, 0, 1] = 1.0, 0.999      # margin 0.001 at both steps
    prefill = base + 0.001                          # ORT's own decode/prefill difference 0.001
    ours = base.copy()
    ours[1, 0, 1] = 1.0005                          # step 1: ours flips, 0.0015 away
    steps = fid.compare({"original": base, "ort_flash": ours}, prefill, "float16")
    assert steps[1]["bound"][0] == pytest.approx(0.002 + 2.0 ** -10, rel=1e-4)
    assert steps[1]["argmax_equal"] == [False] and steps[1]["ties"] == [True] and steps[1]["within"]
    ours[1, 0, 1] = 1.5                             # far past the bound: a tie still, but out
    steps = fid.compare({"original": base, "ort_flash": ours}, prefill, "float16")
    assert steps[1]["ties"] == [True] and not steps[1]["within"]
    base[1, 0, 1] = 0.5                             # a wide margin the flip cannot hide in
    ours[1, 0, 1] = 1.2
    steps = fid.compare({"original": base, "ort_flash": ours}, base, "float16")
    assert steps[1]["unexplained"] == [True]
    s = fid.summarize(steps)
    assert s["unexplained"] == [1] and s["steps_over_bound"] == [1]
    ours[0, 0, 2] = 0.01                            # the prompt step's difference widens every bound
    steps = fid.compare({"original": base, "ort_flash": ours}, base, "float16")
    assert steps[1]["noise"] == [pytest.approx(0.01)]



class _TableDriver:
    """A driver whose logits are a table (steps x B x vocabulary): each feed moves one step."""

    def __init__(self, table):
        self.table, self.k = table, 0

    def start(self, rows, max_length):
        self.k = 0
        return self.table[0]

    def feed(self, tokens):
        self.k += 1
        return self.table[self.k]

    def close(self):
        pass

    def prefill(self, sequence, last):
        return self.table[:last, 0]


def test_fp8_variant_rows_report_the_difference():
    """--with-fp8: the FP8 folder is fed the same tokens as the others; its row has the same figures
    against the same bound (measured: its status says only whether its logits are finite), beside
    ort_flash's own row, and the summary names the variant."""
    rng = np.random.default_rng(2)
    base = rng.standard_normal((5, 1, 7)).astype(np.float32)
    ours = base + np.float32(1e-4)
    fp8 = base + np.float32(0.05) * rng.standard_normal(base.shape).astype(np.float32)
    drivers = {"original": _TableDriver(base), "ort_flash": _TableDriver(ours), fid.FP8_VARIANT: _TableDriver(fp8)}
    reference = _TableDriver(base + np.float32(1e-4))
    cfg = {"kind": "teacher_forced", "tokens": 3, "batch": 1, "driver": "session", "layers": 1, "hidden": 8,
           "heads": 2, "kv_heads": 1, "head_dim": 4, "dtype": "float16"}
    rows = fid._row(drivers, reference, cfg, [np.arange(3, dtype=np.int32)], 4)
    assert [r["peer"] for r in rows] == ["ort_flash", fid.FP8_VARIANT]
    ours_row, fp8_row = rows
    assert ours_row["status"] == "ok" and ours_row["passed"]
    assert fp8_row["status"] == "ok" and fp8_row["max_diff"] == pytest.approx(float(np.abs(fp8 - base).max()))
    assert fp8_row["worst_diff_over_bound"] > ours_row["worst_diff_over_bound"]
    header, table = fid.summary({"rows": rows})
    col = header.index("variant")
    assert [t[col] for t in table] == ["fp16/bf16", "fp8"] and table[1][-1] == "measured"
    bad = fp8.copy()
    bad[2, 0, 3] = np.nan
    drivers = {"original": _TableDriver(base), "ort_flash": _TableDriver(ours), fid.FP8_VARIANT: _TableDriver(bad)}
    assert fid._row(drivers, reference, cfg, [np.arange(3, dtype=np.int32)], 4)[1]["status"] == "mismatch"


VOCAB = 40


def _fake_logits(tokens: list[int]) -> np.ndarray:
    """The stand-in model's logits after ``tokens``: a function of the whole sequence."""
    return np.cos(np.arange(VOCAB) * 0.37 + len(tokens) * 1.3 + sum(tokens) * 0.11).astype(np.float32)


@pytest.fixture
def fake_og(monkeypatch, tmp_path):
    """onnxruntime_genai as far as the GenAI drivers use it, over _fake_logits, recording the
    models loaded and every generator's calls; and a folder whose genai_config.json the drivers
    read. Returns (the module, the folder)."""
    og = types.SimpleNamespace(models=[], generators=[])

    class Model:
        def __init__(self, path):
            self.path = path
            og.models.append(self)

    class GeneratorParams:
        def __init__(self, model):
            self.model, self.options = model, None

        def set_search_options(self, **options):
            self.options = options

    class Generator:
        def __init__(self, model, params):
            self.model, self.options, self.tokens, self.calls = model, params.options, [], []
            og.generators.append(self)

        def append_tokens(self, ids):
            ids = np.asarray(ids)
            self.calls.append(("append", ids.shape, ids.dtype, ids.ravel().tolist()))
            self.tokens += ids.ravel().tolist()

        def rewind_to(self, n):
            self.calls.append(("rewind", n))
            self.tokens = self.tokens[:n]

        def get_logits(self):
            return _fake_logits(self.tokens).reshape(1, 1, -1)

    og.Model, og.GeneratorParams, og.Generator = Model, GeneratorParams, Generator
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", og)
    folder = tmp_path / "genai"
    folder.mkdir()
    io = {"input_ids": "input_ids", "attention_mask": "attention_mask", "past_key_names": "past_key_values.%d.key",
          "past_value_names": "past_key_values.%d.value"}
    out = {"logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}
    decoder = {"filename": "model.onnx", "num_hidden_layers": 1, "num_key_value_heads": 1, "head_size": 8,
               "inputs": io, "outputs": out}
    config = {"model": {"decoder": decoder, "vocab_size": VOCAB, "pad_token_id": 0}}
    (folder / "genai_config.json").write_text(json.dumps(config))
    return og, folder


def test_genai_drivers_step_through_the_e2e_runner(fake_og):
    """GenAIDriver and GenAIRewindDriver step through genai_e2e.Runner (start_forced, feed), one
    og.Model per folder shared by the rewind driver: a generator of one row and the teacher-forced
    length, the prompt as one (1, P) int32 append, each fed token as one (1, 1) append, the logits
    of the whole sequence after each; the rewind driver appends a stale chunk, rewinds to the
    prompt less its last token and appends that token."""
    og, folder = fake_og
    prompt = np.arange(3, 12, dtype=np.int32)
    steps = 5
    plain = fid.GenAIDriver(folder, "cpu")
    rewind = fid.GenAIRewindDriver(folder, "cpu", plain)
    assert len(og.models) == 1 and og.models[0].path == str(folder)
    assert plain.runner is rewind.runner and isinstance(plain.runner, genai_e2e.Runner)
    logits, fed = fid.teacher_forced({"original": plain, "ort_flash": rewind}, [prompt], steps)
    assert logits["original"].shape == (steps + 1, 1, VOCAB) and fed.shape == (steps, 1)
    tokens = prompt.tolist()
    for k in range(steps + 1):
        for v in ("original", "ort_flash"):
            np.testing.assert_array_equal(logits[v][k, 0], _fake_logits(tokens))
        if k < steps:
            assert int(fed[k, 0]) == int(_fake_logits(tokens).argmax())
            tokens.append(int(fed[k, 0]))
    g_plain, g_rewind = og.generators
    max_length = len(prompt) + steps + 1
    assert g_plain.options == {"max_length": max_length, "do_sample": False, "batch_size": 1}
    assert g_rewind.options == {"max_length": max_length + rewind.STALE, "do_sample": False, "batch_size": 1}
    feeds = [("append", (1, 1), np.int32, [t]) for t in fed[:, 0].tolist()]
    assert g_plain.calls == [("append", (1, len(prompt)), np.int32, prompt.tolist())] + feeds
    stale = g_rewind.calls[1]
    assert stale[:3] == ("append", (1, rewind.STALE), np.int32)
    assert g_rewind.calls[0] == g_plain.calls[0] and g_rewind.calls[2:4] == [
        ("rewind", len(prompt) - 1), ("append", (1, 1), np.int32, prompt[-1:].tolist())]
    assert g_rewind.calls[4:] == feeds
    assert g_plain.tokens == g_rewind.tokens == tokens
    with pytest.raises(ValueError, match="more than one row"):
        plain.start([prompt, prompt], max_length)


def test_first_flip_through_the_runner(fake_og):
    """genai_e2e.first_flip over two Runners of the same stand-in model: the original's greedy
    tokens fed to both (one (1, 1) append a step, after a (1, P) prompt), no flip."""
    og, folder = fake_og
    runners = {v: genai_e2e.Runner(folder) for v in genai_e2e.VARIANTS}
    prompt = np.arange(5, 9, dtype=np.int32)
    d = genai_e2e.first_flip(runners, prompt, 4)
    assert d == {"step": None, "steps": 4, "noise": 0.0}
    assert [g.options for g in og.generators] == [{"max_length": len(prompt) + 5, "do_sample": False,
                                                   "batch_size": 1}] * 2
    calls = og.generators[0].calls
    assert calls == og.generators[1].calls and len(calls) == 5
    assert calls[0] == ("append", (1, len(prompt)), np.int32, prompt.tolist())
    assert all(c[:3] == ("append", (1, 1), np.int32) for c in calls[1:])


def _corrupt_rotary_from(folder, position: int) -> None:
    """cos_cache / sin_cache rows >= position replaced by row position - 1, in the rewritten decoder."""
    import onnx
    from onnx import numpy_helper

    path = folder / genai.open_folder(folder).decoder.name
    model = onnx.load(str(path))
    names = {n.input[7] for n in model.graph.node if n.op_type == "GroupQueryAttention" and len(n.input) > 8}
    names |= {n.input[8] for n in model.graph.node if n.op_type == "GroupQueryAttention" and len(n.input) > 8}
    assert names, "no rotary tables on the GroupQueryAttention nodes"
    done = 0
    for init in model.graph.initializer:
        if init.name in names:
            table = numpy_helper.to_array(init).copy()
            table[position:] = table[position - 1]
            init.CopyFrom(numpy_helper.from_array(table, init.name))
            done += 1
    assert done == len(names), (names, done)
    data = [p for p in folder.iterdir() if p.name.startswith(path.name) and p.name != path.name]
    for p in data:
        p.unlink()
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=0)


@_genai
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("model", [[2, 1024, 16, 4], [2, 2048, 16, 4]], ids=["d64", "d128"])
def test_cuda_rewritten_folder_within_rounding(model, dtype, tmp_path_factory):
    """CUDA: GenAI's builder output for a 2-layer LLaMA-shaped model, rewritten with every
    GroupQueryAttention mapped, follows the original within rounding over 64 fed tokens after a
    600-token prompt, batch 1 and a padded batch of two (the suite runs the published grid)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime has no CUDA execution provider")
    g = fid.grid("cuda", quick=True, overrides={"genai_model": model, "dtypes": [dtype], "seqlens": [600]})
    mg = fid.model_grid(g, model, dtype, "cuda")
    cache = tmp_path_factory.getbasetemp() / "genai-cuda"
    cache.mkdir(exist_ok=True)
    original = genai_e2e.genai_folder(mg, "cuda", cache)
    rewritten = original.with_name(original.name + "-ort_flash-all")
    info = fid._rewrite_all(original, rewritten)
    assert info["fused"] == model[0], info
    sessions = {v: fid.SessionDriver(f, "cuda") for v, f in (("original", original), ("ort_flash", rewritten))}
    genai_drivers = {v: fid.GenAIDriver(f, "cuda") for v, f in (("original", original), ("ort_flash", rewritten))}
    rewind = {v: fid.GenAIRewindDriver(f, "cuda", genai_drivers[v]) for v, f in (("original", original), ("ort_flash", rewritten))}
    for batch, drivers in ((1, genai_drivers), (1, rewind), (1, sessions), (2, sessions)):
        rows = fid.prompt_rows(np.random.default_rng(batch), 600, batch, mg["vocab"])
        s = fid.check(drivers, sessions["original"], rows, 64, dtype)
        assert s["passed"], {k: s[k] for k in ("steps_over_bound", "unexplained", "worst_diff_over_bound", "max_diff")}
    shutil.rmtree(rewritten, ignore_errors=True)
