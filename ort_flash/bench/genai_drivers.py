"""The drivers of the teacher-forced fidelity check (ort_flash.bench.genai_fidelity): a GenAI
folder fed one token a step, through ``onnxruntime_genai`` itself (GenAIDriver, GenAIRewindDriver)
or through an ONNX Runtime session fed as GenAI feeds it (SessionDriver: shared KV buffers,
window-sized caches, position_ids, convolution and recurrent states), and what they read of a
folder (folder_config, cache_windows)."""
from __future__ import annotations

import pathlib

import numpy as np

from ort_flash.bench import genai_e2e


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
