"""Teacher-forced fidelity through ONNX Runtime GenAI: does the rewritten folder compute, step by
step, what the original computes?

Greedy sequences of two low-precision models part at the first near tie, which proves nothing
either way. So both models are fed the same tokens: the prompt (one row, or two rows of different
lengths), then, one token per step, the original's greedy choice (each step one decode call of the
model over the shared KV buffer), through GenAI's ``append_tokens`` or a session fed as GenAI
feeds it (the drivers below). The logits of every step are compared.

The rounding bound is measured, not assumed. The original also runs every row's whole sequence
(prompt and the fed tokens) as one prefill, which gives the logits of every step a second time
from ONNX Runtime's other kernels. At step k, over the vocabulary, per row:

- ``diff``: max |logits(ort_flash) - logits(original)|, both decoding;
- ``noise``: the larger of max |original decoding - original prefill| at step k (ONNX Runtime's
  own two paths: the rounding between two correct implementations, at this step's logits) and
  ``diff`` at the prompt (step 0: the two prefill kernels, checked at op level against fp64);
- ``bound`` = 2 * noise + one unit of the dtype's rounding at the largest logit (the numerical
  contract of the op tests: at most twice the difference between plain implementations);
- the original's top-2 margin, and whether ort_flash's argmax is the original's.

A step passes where ``diff <= bound``. A step where the two argmaxes differ is a tie within
rounding where the original's margin there is below the bound; otherwise it is unexplained.
Folders and models come from ``genai_e2e`` (GenAI's own builder, random LLaMA-shaped weights).

``--with-fp8``: a third folder, rewritten with ``--attention-precision fp8``, fed the same tokens
in the same run; its rows (peer ``ort_flash_fp8``) report the same figures against the same
bound, as the difference FP8 makes: measured, not judged by the fp16 bound (a row fails only where
a step's logits are not finite).
"""
from __future__ import annotations

import pathlib
import time

import numpy as np

from ort_flash.bench import genai_e2e, results
from ort_flash.bench.measure import Budget, Context
from ort_flash.bench.tables import text_table

VARIANTS = genai_e2e.VARIANTS
FP8_VARIANT = genai_e2e.FP8_VARIANT
# One unit of rounding (2^-mantissa bits) at the largest logit: the floor of the bound.
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23}
TARGET_S = {False: 0.0, True: 0.0}  # nothing is timed


def grid(device: str, quick: bool, overrides: dict | None = None) -> dict:
    o = overrides or {}
    if device == "cuda":
        g = dict(models=[[16, 2048, 32, 8], [4, 4096, 32, 8]], dtypes=["float16", "bfloat16"],
                 vocab=32000, prompts=[128, 2048, 16384] if quick else [128, 512, 2048, 8192, 16384],
                 batches=[1, 2], steps=32 if quick else 128)
    else:
        g = dict(models=[[2, 256, 4, 2], [2, 256, 8, 2]], dtypes=["float32"], vocab=512,
                 prompts=[64, 200] if quick else [64, 128, 256, 512], batches=[1, 2],
                 steps=16 if quick else 64)
    if o.get("genai_model"):
        g["models"] = [list(o["genai_model"])]
    for key, name in (("dtypes", "dtypes"), ("seqlens", "prompts"), ("batches", "batches")):
        if o.get(key):
            g[name] = list(o[key])
    if o.get("steps"):
        g["steps"] = o["steps"]
    return g


def model_grid(g: dict, model: list[int], dtype: str, device: str) -> dict:
    """The genai_e2e grid of one model: the same folders (and cache) as the timing suite, whose
    default contexts set the positions the builder writes."""
    e2e = genai_e2e.grid(device, quick=False)
    layers, hidden, heads, kv_heads = model
    return dict(e2e, dtype=dtype, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                vocab=g["vocab"], prompts=g["prompts"],
                contexts=[max(max(e2e["contexts"]), max(g["prompts"]) + g["steps"])])


def prepare(g: dict, device: str, cache: pathlib.Path, models: list | None = None) -> list[pathlib.Path]:
    """GenAI's builder output for the grid's models (or ``models``) in every dtype, into the cache
    the suite reads (so that a GPU session can build them while it runs something else)."""
    return [genai_e2e.genai_folder(model_grid(g, m, dtype, device), device, cache)
            for m in (models or g["models"]) for dtype in g["dtypes"]]


def prompt_rows(rng: np.random.Generator, tokens: int, batch: int, vocab: int) -> list[np.ndarray]:
    """Random prompts: the first row ``tokens`` long, the second (batch 2) about three quarters of it
    and odd, so that GenAI pads it."""
    lengths = [tokens] + [max(1, (3 * tokens) // 4 - 1) | 1 for _ in range(batch - 1)]
    return [rng.integers(3, vocab, n).astype(np.int32) for n in lengths]


class GenAIDriver:
    """A GenAI folder through ``onnxruntime_genai`` itself, as deployed: ``append_tokens`` of the
    prompt, then of one token a step (``genai_e2e.Runner``'s teacher-forced stepping, over the
    og.Model of ``shared``, a GenAIDriver of the same folder, where one is given). GenAI takes a
    second ``append_tokens`` of a batch of more than one row only after a rewind to zero, so this
    driver feeds batch 1 only."""

    name = "genai"

    def __init__(self, folder: pathlib.Path, device: str, shared=None):
        self.runner = shared.runner if isinstance(shared, GenAIDriver) else genai_e2e.Runner(folder)
        self.pad = folder_config(folder)["pad"]
        self.gen = None

    def start(self, rows: list[np.ndarray], max_length: int) -> np.ndarray:
        if len(rows) != 1:
            raise ValueError("GenAI appends tokens to a batch of more than one row only once")
        prompt = rows[0]
        self.gen, logits = self.runner.start_forced(prompt, max_length - len(prompt) - 1)
        return logits.reshape(1, -1)

    def feed(self, tokens: np.ndarray) -> np.ndarray:
        return self.runner.feed(self.gen, tokens).reshape(1, -1)

    def _logits(self) -> np.ndarray:
        return self.runner.logits(self.gen).reshape(1, -1)

    def close(self) -> None:
        self.gen = None


class GenAIRewindDriver(GenAIDriver):
    """GenAI after a rewind, over a buffer that holds other tokens' keys: the prompt, then a chunk
    of ``STALE`` other tokens appended at once (a prefill over a past), then ``rewind_to`` the
    prompt less its last token, whose ``append_tokens`` gives the prompt step's logits through the
    decode path. The fed tokens then overwrite rows that held the chunk's keys, as GenAI's rewind
    between turns leaves them."""

    name = "genai_rewind"
    STALE = 64

    def start(self, rows: list[np.ndarray], max_length: int) -> np.ndarray:
        super().start(rows, max_length + self.STALE)
        prompt = rows[0]
        stale = (prompt[: self.STALE] + 1) % max(int(prompt.max()) + 1, 4)
        self.gen.append_tokens(np.resize(np.maximum(stale, 3), self.STALE).reshape(1, -1).astype(np.int32))
        self.gen.rewind_to(len(prompt) - 1)
        self.gen.append_tokens(prompt[-1:].reshape(1, 1))
        return self._logits()


class SessionDriver:
    """The folder's decoder in an ONNX Runtime session (ort_flash registered), fed as GenAI feeds
    it: ``input_ids``; ``attention_mask`` with a 1 for every token so far and a 0 for each padding
    position of a shorter row (from which the graph computes ``seqlens_k``); one KV buffer of
    ``max_length`` positions per layer, bound as both past and present (GenAI's shared buffer), or
    of the window's W positions where the layer keeps a window-sized cache (sliding_window_cache=1;
    ONNX Runtime's CUDA op takes exactly W there). Any batch: rows of different lengths are padded at
    the end, as ONNX Runtime's GroupQueryAttention expects (a window-sized cache takes no padding:
    ``windowed`` says whether the model has one). Where the decoder asks for them, as GenAI gives
    them: ``position_ids`` (each token's index in its row: the builder's models whose rotary stays
    outside the attention; a (3, B, S) input, MRoPE's temporal, height and width positions, gets the
    index in all three, as for a text-only prompt: Qwen 3.5); the state of each layer without a KV
    cache, carried from each call's present to the next call's past: a convolution state (LFM2's
    convolution layers, Qwen 3.5's linear-attention layers) and a recurrent state (Qwen 3.5's
    linear attention); their rows take no padding."""

    name = "session"

    def __init__(self, folder: pathlib.Path, device: str, shared=None):
        import torch

        from ort_flash._session import InferenceSession

        self.cfg = folder_config(folder)
        self.pad = self.cfg["pad"]
        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
        self.session = InferenceSession(folder / self.cfg["filename"], providers=providers)
        self.windows = cache_windows(folder / self.cfg["filename"], self.cfg)
        self.windowed = bool(self.windows)
        inputs = {i.name: i for i in self.session.get_inputs()}
        layers = range(self.cfg["layers"])
        self.kv_layers = [i for i in layers if self.cfg["past_key"] % i in inputs]
        # (past name, present name, shape less the batch, torch dtype, ONNX type) of every state
        self.states = [(past % i, present % i, inputs[past % i].shape[1:], *_types(inputs[past % i].type))
                       for past, present in ((self.cfg["past_conv"], self.cfg["present_conv"]),
                                             (self.cfg["past_recurrent"], self.cfg["present_recurrent"]))
                       for i in layers if past and past % i in inputs]
        conv = self.cfg["past_conv"]  # {layer: state shape} of the convolution states alone
        self.conv_shapes = {i: inputs[conv % i].shape[1:] for i in layers if conv and conv % i in inputs}
        self.position_ids = self.cfg["position_ids"] in inputs
        self.mrope = self.position_ids and len(inputs[self.cfg["position_ids"]].shape) == 3
        past = inputs[self.cfg["past_key"] % self.kv_layers[0]]
        self.torch_dtype, self.onnx_type = _types(past.type)
        out = next(o for o in self.session.get_outputs() if o.name == self.cfg["logits"])
        self.logits_types = _types(out.type)  # float32 logits in the builder's bfloat16 models
        self.device = device
        self.torch_device = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
        self.kv: list = []
        self.mask = np.zeros((0, 0), np.int64)

    def start(self, rows: list[np.ndarray], max_length: int) -> np.ndarray:
        b = len(rows)
        self.kv = self.buffers(b, max_length)
        ids = padded(rows, self.pad)
        self.mask = (np.arange(ids.shape[1])[None, :] < np.array([len(r) for r in rows])[:, None]).astype(np.int64)
        logits = self.run(ids, self.kv, self.mask)
        return logits[np.arange(b), [len(r) - 1 for r in rows]].float().cpu().numpy()

    def feed(self, tokens: np.ndarray) -> np.ndarray:
        self.mask = np.concatenate([self.mask, np.ones((len(tokens), 1), np.int64)], axis=1)
        return self.run(tokens.reshape(-1, 1), self.kv, self.mask)[:, -1].float().cpu().numpy()

    def prefill(self, sequence: np.ndarray, last: int) -> np.ndarray:
        """The logits of the last ``last`` positions of one row run as a single prefill (float32,
        last x vocabulary), in buffers of its own."""
        kv, mask = self.buffers(1, len(sequence)), np.ones((1, len(sequence)), np.int64)
        return self.run(sequence.reshape(1, -1), kv, mask)[0, -last:].float().cpu().numpy()

    def buffers(self, batch: int, length: int) -> list:
        """Zeroed K and V buffers of every layer with a KV cache, (batch, kv heads, length, head
        size), a layer with a window-sized cache its window's length instead; then every zeroed
        state (convolution, recurrent)."""
        import torch

        c = self.cfg
        kv = [torch.zeros((batch, c["kv_heads"], self.windows.get(i, length), c["head_size"]),
                          dtype=self.torch_dtype, device=self.torch_device) for i in self.kv_layers for _ in "kv"]
        return kv + [torch.zeros((batch, *shape), dtype=dtype, device=self.torch_device)
                     for _, _, shape, dtype, _ in self.states]

    def run(self, ids: np.ndarray, kv: list, mask: np.ndarray):
        """One call of the decoder over the buffers ``kv`` (K and V bound as past and present, a
        state as past and then overwritten by its present); its logits (B, S, vocabulary) in the
        model's dtype."""
        import torch

        c = self.cfg
        io = self.session.io_binding()
        io.bind_cpu_input(c["input_ids"], np.ascontiguousarray(ids, dtype=np.int64))
        io.bind_cpu_input(c["attention_mask"], mask)
        if self.position_ids:  # each token's index in its row; padding 0
            positions = np.where(mask == 1, np.cumsum(mask, axis=1) - 1, 0)[:, -ids.shape[1]:]
            if self.mrope:  # text only: the same index for time, height and width
                positions = np.broadcast_to(positions, (3, *positions.shape))
            io.bind_cpu_input(c["position_ids"], np.ascontiguousarray(positions, dtype=np.int64))
        names = [(c["past_key"] % i, c["present_key"] % i, c["past_value"] % i, c["present_value"] % i)
                 for i in self.kv_layers]
        for (past_k, present_k, past_v, present_v), buf_k, buf_v in zip(names, kv[0::2], kv[1::2]):
            for name, bind, buf in ((past_k, io.bind_input, buf_k), (present_k, io.bind_output, buf_k),
                                    (past_v, io.bind_input, buf_v), (present_v, io.bind_output, buf_v)):
                bind(name, self.device, 0, self.onnx_type, list(buf.shape), buf.data_ptr())
        states = kv[2 * len(self.kv_layers):]
        presents = [torch.empty_like(state) for state in states]
        for (past, present_name, _, _, onnx_type), state, present in zip(self.states, states, presents):
            for name, buf, bind in ((past, state, io.bind_input), (present_name, present, io.bind_output)):
                bind(name, self.device, 0, onnx_type, list(buf.shape), buf.data_ptr())
        logits = torch.empty((ids.shape[0], ids.shape[1], c["vocab"]), dtype=self.logits_types[0], device=self.torch_device)
        io.bind_output(c["logits"], self.device, 0, self.logits_types[1], list(logits.shape), logits.data_ptr())
        self.session.run_with_iobinding(io)
        for state, present in zip(states, presents):
            state.copy_(present)
        return logits

    def close(self) -> None:
        self.kv = []


def _types(onnx_type: str) -> tuple:
    """(torch dtype, ONNX element type) of an ONNX Runtime type string such as "tensor(float16)"."""
    import torch
    from onnx import TensorProto

    types = {"tensor(float16)": (torch.float16, TensorProto.FLOAT16),
             "tensor(bfloat16)": (torch.bfloat16, TensorProto.BFLOAT16),
             "tensor(float)": (torch.float32, TensorProto.FLOAT)}
    if onnx_type not in types:
        raise ValueError(f"a tensor of type {onnx_type}: the check runs float16, bfloat16 and float32 models")
    return types[onnx_type]
DRIVERS = {"genai": GenAIDriver, "genai_rewind": GenAIRewindDriver, "session": SessionDriver}


def folder_config(folder: pathlib.Path) -> dict:
    """What the drivers need of a GenAI folder's genai_config.json."""
    import json

    cfg = json.loads((pathlib.Path(folder) / "genai_config.json").read_text())["model"]
    dec = cfg["decoder"]
    pad = cfg.get("pad_token_id")
    return {"filename": dec["filename"], "layers": dec["num_hidden_layers"], "kv_heads": dec["num_key_value_heads"],
            "head_size": dec["head_size"], "vocab": cfg["vocab_size"],
            "pad": int(pad[0] if isinstance(pad, list) else pad) if pad is not None else 0,
            "input_ids": dec["inputs"]["input_ids"], "attention_mask": dec["inputs"]["attention_mask"],
            "past_key": dec["inputs"]["past_key_names"], "past_value": dec["inputs"]["past_value_names"],
            "present_key": dec["outputs"]["present_key_names"], "present_value": dec["outputs"]["present_value_names"],
            "position_ids": dec["inputs"].get("position_ids", "position_ids"),
            "past_conv": dec["inputs"].get("past_conv_names", ""),
            "present_conv": dec["outputs"].get("present_conv_names", ""),
            "past_recurrent": dec["inputs"].get("past_recurrent_names", ""),
            "present_recurrent": dec["outputs"].get("present_recurrent_names", ""),
            "logits": dec["outputs"]["logits"]}


def cache_windows(model: pathlib.Path, cfg: dict) -> dict[int, int]:
    """{layer: W} of the decoder's GroupQueryAttention nodes (ONNX Runtime's or ort_flash's) that
    keep a window-sized KV cache (sliding_window_cache=1, local_window_size W), by the layer whose
    past_key input they read."""
    import onnx

    layer_of = {cfg["past_key"] % i: i for i in range(cfg["layers"])}
    out = {}
    for node in onnx.load(str(model), load_external_data=False).graph.node:
        if node.op_type != "GroupQueryAttention" or len(node.input) < 4 or node.input[3] not in layer_of:
            continue
        attrs = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        if attrs.get("sliding_window_cache", 0) == 1 and attrs.get("local_window_size", -1) > 0:
            out[layer_of[node.input[3]]] = attrs["local_window_size"]
    return out


def padded(rows: list[np.ndarray], pad: int) -> np.ndarray:
    """Rows of different lengths as one (B, longest) batch, padded at the end."""
    out = np.full((len(rows), max(len(r) for r in rows)), pad, dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def teacher_forced(drivers: dict, rows: list[np.ndarray], steps: int) -> tuple[dict, np.ndarray]:
    """Every driver fed the same tokens: the prompt rows (one batch), then ``steps`` times the
    original's greedy choice of every row, one token a call. Returns each driver's logits of every
    step (float32, (steps + 1, B, vocabulary): step 0 is the prompt's) and the fed tokens
    (steps, B)."""
    max_length = max(len(r) for r in rows) + steps + 1
    logits = {v: [d.start(rows, max_length)] for v, d in drivers.items()}
    fed = []
    for _ in range(steps):
        token = logits["original"][-1].argmax(-1).astype(np.int32)
        fed.append(token)
        for v, d in drivers.items():
            logits[v].append(d.feed(token))
    for d in drivers.values():
        d.close()
    return {v: np.stack(x) for v, x in logits.items()}, np.stack(fed) if fed else np.zeros((0, len(rows)), np.int32)


def prefill(session, rows: list[np.ndarray], fed: np.ndarray) -> np.ndarray:
    """The model's logits of every step again, from one prefill per row of its whole sequence
    (float32, (steps + 1, B, vocabulary))."""
    steps = fed.shape[0]
    return np.stack([session.prefill(np.concatenate([row, fed[:, b]]), steps + 1) for b, row in enumerate(rows)], axis=1)


def compare(decode: dict, prefill: np.ndarray, dtype: str, variant: str = "ort_flash") -> list[dict]:
    """Per step and row: diff, noise, bound, the original's margin, argmax agreement (the module's
    docstring defines them) of ``variant`` against the original. ``prefill``: the original's
    logits of every step from its prefill."""
    do, df = decode["original"], decode[variant]
    at_prompt = np.abs(df[0] - do[0]).max(-1)
    out = []
    for k in range(do.shape[0]):
        diff = np.abs(df[k] - do[k]).max(-1)
        noise = np.maximum(np.abs(do[k] - prefill[k]).max(-1), at_prompt)
        bound = 2 * noise + EPS[dtype] * np.abs(do[k]).max(-1)
        top2 = np.sort(do[k], axis=-1)[:, -2:]
        margin = top2[:, 1] - top2[:, 0]
        agree = df[k].argmax(-1) == do[k].argmax(-1)
        out.append({"step": k, "diff": diff.tolist(), "noise": noise.tolist(), "bound": bound.tolist(),
                    "margin": margin.tolist(), "argmax_equal": agree.tolist(),
                    "within": bool((diff <= bound).all()),
                    "ties": [bool(not a and m <= b) for a, m, b in zip(agree, margin, bound)],
                    "unexplained": [bool(not a and m > b) for a, m, b in zip(agree, margin, bound)]})
    return out


def summarize(steps: list[dict]) -> dict:
    """One row's figures from its steps."""
    ratio = [max(d / b if b > 0 else (0.0 if d == 0 else float("inf")) for d, b in zip(s["diff"], s["bound"]))
             for s in steps]
    flips = [s["step"] for s in steps if not all(s["argmax_equal"])]
    return {"steps": len(steps) - 1, "max_diff": max(max(s["diff"]) for s in steps),
            "max_bound": max(max(s["bound"]) for s in steps), "min_bound": min(min(s["bound"]) for s in steps),
            "worst_diff_over_bound": max(ratio), "worst_step": int(np.argmax(ratio)),
            "steps_over_bound": [s["step"] for s in steps if not s["within"]],
            "prefill_diff": max(steps[0]["diff"]), "argmax_differs_at": flips,
            "ties": [s["step"] for s in steps if any(s["ties"])],
            "unexplained": [s["step"] for s in steps if any(s["unexplained"])],
            "min_margin": min(min(s["margin"]) for s in steps)}


def check(drivers: dict, reference, rows: list[np.ndarray], steps: int, dtype: str) -> dict:
    """The whole check for one prompt batch, decoding through ``drivers`` (original and ort_flash,
    and ort_flash_fp8 where given) and prefilling the original through ``reference`` (a
    SessionDriver): the row's summary, with every step's figures; an FP8 variant's own under
    ``fp8``."""
    t0 = time.monotonic()
    decode, fed = teacher_forced(drivers, rows, steps)
    ref = prefill(reference, rows, fed)
    per_step = compare(decode, ref, dtype)
    s = summarize(per_step)
    s.update(per_step=per_step, seconds=time.monotonic() - t0, prompt_lengths=[len(r) for r in rows],
             fed=fed.T.tolist())
    s["passed"] = not s["steps_over_bound"] and not s["unexplained"]
    if FP8_VARIANT in decode:
        fp8_steps = compare(decode, ref, dtype, FP8_VARIANT)
        s["fp8"] = dict(summarize(fp8_steps), per_step=fp8_steps,
                        finite=bool(np.isfinite(decode[FP8_VARIANT]).all()))
    return s


def run(ctx: Context, suite: dict, ceilings: dict, budget: Budget, args, save, progress) -> None:
    g = suite["grid"]
    cache = pathlib.Path(getattr(args, "cache_dir", None) or "/tmp/ort_flash_bench") / "genai"
    cache.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(getattr(args, "seed", 0))
    suite["models"] = []
    for model in g["models"]:
        for dtype in g["dtypes"]:
            mg = model_grid(g, model, dtype, ctx.device)
            todo = [(p, b, d) for p in g["prompts"] for b in g["batches"] for d in _drivers(b)]
            if not budget.allows():
                suite["not_run"].extend(_config(mg, p, b, d) for p, b, d in todo)
                continue
            try:
                original = genai_e2e.genai_folder(mg, ctx.device, cache)
                rewritten = original.with_name(original.name + "-ort_flash-all")
                info = {"original": str(original), "rewritten": str(rewritten), "dtype": dtype,
                        "model": model, "rewrite": _rewrite_all(original, rewritten)}
                folders = {"original": original, "ort_flash": rewritten}
                if getattr(args, "with_fp8", False):
                    fp8 = original.with_name(original.name + "-ort_flash-all-fp8")
                    info["rewrite_fp8"] = _rewrite_all(original, fp8, "fp8")
                    folders[FP8_VARIANT] = fp8
                suite["models"].append(info)
                drivers: dict = {}
                for name, cls in DRIVERS.items():  # the GenAI drivers share one og.Model per folder
                    drivers[name] = {v: cls(f, ctx.device, drivers.get("genai", {}).get(v)) for v, f in folders.items()}
            except Exception as e:  # noqa: BLE001 - a model that cannot be built is its rows' reason
                reason = _error(e)
                suite["rows"].extend({"config": _config(mg, p, b, d), "peer": "ort_flash", "status": "error",
                                      "reason": reason} for p, b, d in todo)
                save()
                continue
            for i, (p, b, d) in enumerate(progress(todo, desc=f"fidelity {model} {dtype}", unit="cfg")):
                if not budget.allows():
                    suite["not_run"].extend(_config(mg, q, c, e) for q, c, e in todo[i:])
                    break
                rows = prompt_rows(rng, p, b, mg["vocab"])
                suite["rows"].extend(_row(drivers[d], drivers["session"]["original"], _config(mg, p, b, d), rows, g["steps"]))
                suite["elapsed_s"] = budget.elapsed
                save()
            drivers.clear()


def _drivers(batch: int) -> list[str]:
    """Batch 1 runs through GenAI itself (fresh, and after a rewind over stale rows) and through the
    session driver; a batch of two only through the session driver (GenAI appends to such a batch
    once)."""
    return ["genai", "genai_rewind", "session"] if batch == 1 else ["session"]


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _rewrite_all(original: pathlib.Path, rewritten: pathlib.Path, attention_precision: str = "model") -> dict:
    """Every GroupQueryAttention of the folder mapped (every head size too): the check covers what
    the rewriter may map, not only what it maps by default."""
    return genai_e2e.rewrite_folder(original, rewritten, gqa_cuda="all", attention_precision=attention_precision)


def _config(mg: dict, prompt: int, batch: int, driver: str) -> dict:
    return {"kind": "teacher_forced", "tokens": prompt, "batch": batch, "driver": driver, "layers": mg["layers"],
            "hidden": mg["hidden"], "heads": mg["heads"], "kv_heads": mg["kv_heads"],
            "head_dim": mg["hidden"] // mg["heads"], "dtype": mg["dtype"]}


def _row(drivers: dict, reference, cfg: dict, rows: list[np.ndarray], steps: int) -> list[dict]:
    """The configuration's rows: ort_flash's, and ort_flash_fp8's where the drivers have it."""
    try:
        s = check(drivers, reference, rows, steps, cfg["dtype"])
    except Exception as e:  # noqa: BLE001 - one configuration's failure is its row
        return [{"config": cfg, "peer": "ort_flash", "status": "error", "reason": _error(e)}]
    fp8 = s.pop("fp8", None)
    row = {"config": cfg, "peer": "ort_flash", "status": "ok" if s["passed"] else "mismatch", **s}
    if not s["passed"]:
        row["reason"] = (f"steps {s['steps_over_bound'][:8]} over the rounding bound, argmax differences "
                         f"unexplained by a tie at {s['unexplained'][:8]}")
    out = [row]
    if fp8 is not None:
        r8 = {"config": cfg, "peer": FP8_VARIANT, "status": "ok" if fp8["finite"] else "mismatch",
              "prompt_lengths": s["prompt_lengths"], **fp8}
        if not fp8["finite"]:
            r8["reason"] = "logits not finite"
        out.append(r8)
    return out


def summary(suite: dict) -> tuple[list[str], list[list]]:
    header = ["model", "dtype", "driver", "batch", "prompt", "variant", "steps", "max diff", "bound (min-max)",
              "worst diff/bound", "argmax differs (steps)", "ties", "unexplained", "passed"]
    rows = []
    for r in suite["rows"]:
        c = r["config"]
        name = f"L{c['layers']} d{c['head_dim']}"
        variant = "fp8" if r["peer"] == FP8_VARIANT else "fp16/bf16"
        if r["status"] == "error":
            rows.append([name, c["dtype"], c["driver"], c["batch"], c["tokens"], variant, "error", r["reason"][:60],
                         "", "", "", "", "", False])
            continue
        passed = r["passed"] if r["peer"] != FP8_VARIANT else "measured"
        rows.append([name, c["dtype"], c["driver"], c["batch"], "/".join(map(str, r["prompt_lengths"])), variant,
                     r["steps"], f"{r['max_diff']:.3g}", f"{r['min_bound']:.3g}-{r['max_bound']:.3g}",
                     f"{r['worst_diff_over_bound']:.2f} @{r['worst_step']}", len(r["argmax_differs_at"]),
                     len(r["ties"]), r["unexplained"][:4] or 0, passed])
    return header, rows


def print_summary(suite: dict) -> None:
    header, rows = summary(suite)
    if rows:
        print(text_table(header, rows, title=f"\nGenAI teacher-forced fidelity on {suite['device']}: the original's "
                         "greedy tokens fed to both, logits compared at every step"))
    print(results.format_reasons(suite["rows"]))
