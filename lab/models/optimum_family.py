"""Tiny random Hugging Face models exported with Optimum (``optimum-onnx``), as users export them.

    from lab.models.optimum_family import OptimumSpec, export
    path = export(OptimumSpec("bart", "text2text-generation-with-past"), "decoder_model_merged")

Every family is a tiny config (the ones ``lab/models/families.py`` uses where the family is there too)
built with ``torch.manual_seed(0)``, saved to a folder with ``save_pretrained`` and exported from
that folder with ``optimum.exporters.onnx.main_export`` for one task, no hub. Optimum writes one
file per submodel: ``model`` for encoders and decoder-only models (``text-generation-with-past``
gives one file with ``past_key_values.*`` inputs), ``encoder_model`` + ``decoder_model`` for
seq2seq, plus ``decoder_with_past_model`` and ``decoder_model_merged`` (one graph, an ``If`` on
``use_cache_branch`` holding both decoders) with past.

optimum-onnx 0.1.0 needs transformers < 4.58 while the dev venv has 5.x, so the export runs in
its own environment: ``.ci/optimum-constraints.txt`` pins it, ``venv_python`` builds it on
demand (``$ORT_FLASH_OPTIMUM_VENV`` or ``~/.cache/ort_flash/optimum-venv``) and
``lab/models/optimum_worker.py`` runs there. The exports are cached beside the families' ones
(``lab.models.families.cache_dir``) in one folder per spec, keyed by the spec, the config and the
pinned versions, written atomically; a spec the exporter cannot export is recorded as a
``.failed`` file with the exporter's message and raises ``ExportFailure``, and so does a file
that ONNX Runtime cannot load (recorded beside it; the spec's other files stay usable).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from lab.models.families import CONFIGS as _TORCH_CONFIGS  # noqa: E402
from lab.models.families import ExportFailure, cache_dir  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / ".ci" / "optimum-constraints.txt"
WORKER = ROOT / "lab" / "models" / "optimum_worker.py"
SEED = 0
REVISION = 1  # bump when the worker or a builder changes in a way the key does not show
TIMEOUT = 1800  # seconds for one worker run (every export) or one step of the venv build

_TEXT = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=128)
_VISION = dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=128)
_LLAMA = _TORCH_CONFIGS["llama"]
ENCODER_TASKS = ("feature-extraction",)
DECODER_TASKS = ("text-generation", "text-generation-with-past")
SEQ2SEQ_TASKS = ("text2text-generation", "text2text-generation-with-past")
SPEECH_TASKS = ("automatic-speech-recognition", "automatic-speech-recognition-with-past")

# family -> (transformers config class, model class saved, config arguments, tasks)
FAMILIES: dict[str, tuple[str, str, dict, tuple[str, ...]]] = {
    "bert": ("BertConfig", "BertModel", _TORCH_CONFIGS["bert"], ENCODER_TASKS),
    # RoBERTa's positions start after padding_idx 1: two more rows than the sequence
    "roberta": ("RobertaConfig", "RobertaModel", dict(_TEXT, max_position_embeddings=66),
                ENCODER_TASKS),
    "distilbert": ("DistilBertConfig", "DistilBertModel",
                   dict(vocab_size=128, dim=64, n_layers=2, n_heads=2, hidden_dim=128,
                        max_position_embeddings=64), ENCODER_TASKS),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", _TORCH_CONFIGS["gpt2"], DECODER_TASKS),
    "llama": ("LlamaConfig", "LlamaForCausalLM", _LLAMA, DECODER_TASKS),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _TORCH_CONFIGS["qwen2"], DECODER_TASKS),
    # Mistral keeps its default sliding_window (4096): the window term is in every export
    "mistral": ("MistralConfig", "MistralForCausalLM", _LLAMA, DECODER_TASKS),
    # Phi-3's default pad/eos ids (32000) lie outside the tiny vocabulary
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             dict(_LLAMA, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                  original_max_position_embeddings=128), DECODER_TASKS),
    "t5": ("T5Config", "T5ForConditionalGeneration", _TORCH_CONFIGS["t5"], SEQ2SEQ_TASKS),
    "bart": ("BartConfig", "BartForConditionalGeneration", _TORCH_CONFIGS["bart"], SEQ2SEQ_TASKS),
    "whisper": ("WhisperConfig", "WhisperForConditionalGeneration", _TORCH_CONFIGS["whisper"],
                SPEECH_TASKS),
    "vit": ("ViTConfig", "ViTModel", _TORCH_CONFIGS["vit"], ENCODER_TASKS),
    "clip": ("CLIPConfig", "CLIPModel",
             dict(text_config=dict(_TEXT, max_position_embeddings=64), vision_config=_VISION,
                  projection_dim=32), ENCODER_TASKS),
}
# main_export's dummy-input sizes where its defaults do not fit the tiny config: Whisper's
# encoder takes exactly 2 x max_source_positions frames (Optimum's default is 3000).
SHAPES = {"whisper": {"nb_max_frames": 2 * _TORCH_CONFIGS["whisper"]["max_source_positions"]}}
FILES = {
    "feature-extraction": ("model",), "text-generation": ("model",),
    "text-generation-with-past": ("model",),
    "text2text-generation": ("encoder_model", "decoder_model"),
    "automatic-speech-recognition": ("encoder_model", "decoder_model"),
    "text2text-generation-with-past": ("encoder_model", "decoder_model",
                                       "decoder_with_past_model", "decoder_model_merged"),
    "automatic-speech-recognition-with-past": ("encoder_model", "decoder_model",
                                               "decoder_with_past_model", "decoder_model_merged"),
}
DTYPES = ("float32", "float16")
# "default": what transformers 4.57 picks (sdpa where the model has it), as a user's export gets
ATTENTIONS = ("default", "eager")
EAGER_ONLY = ("t5",)  # no sdpa in transformers 4.57: "eager" would repeat "default"


@dataclasses.dataclass(frozen=True)
class OptimumSpec:
    family: str
    task: str
    dtype: str = "float32"
    attn: str = "default"

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"{self.family!r} is not one of {tuple(FAMILIES)}")
        if self.task not in FAMILIES[self.family][3]:
            raise ValueError(f"{self.family} exports for {FAMILIES[self.family][3]}, not {self.task!r}")
        if self.dtype not in DTYPES or self.attn not in ATTENTIONS:
            raise ValueError(f"dtype one of {DTYPES}, attn one of {ATTENTIONS}")

    @property
    def id(self) -> str:
        dtype = "fp32" if self.dtype == "float32" else "fp16"
        eager = "-eager" if self.attn == "eager" else ""
        return f"optimum-{self.family}-{self.task}-{dtype}{eager}"

    @property
    def files(self) -> tuple[str, ...]:
        return FILES[self.task]

    @property
    def past(self) -> bool:
        return self.task.endswith("-with-past")


def specs() -> list[OptimumSpec]:
    return [OptimumSpec(f, t, d, a) for f, (*_, tasks) in FAMILIES.items() for t in tasks
            for d in DTYPES for a in ATTENTIONS if a == "default" or f not in EAGER_ONLY]


def _pinned() -> list[str]:
    """The requirement lines of the constraints file (comments do not change the key)."""
    lines = (line.split("#", 1)[0].strip() for line in CONSTRAINTS.read_text().splitlines())
    return [line for line in lines if line]


def cache_key(spec: OptimumSpec) -> str:
    config_class, model_class, config, _ = FAMILIES[spec.family]
    recipe = dict(spec=dataclasses.asdict(spec), config_class=config_class, model_class=model_class,
                  config=config, shapes=SHAPES.get(spec.family, {}), seed=SEED,
                  revision=REVISION, pinned=_pinned(), python=sys.version_info[:2])
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return f"{spec.id}-{digest}"


def export(spec: OptimumSpec, name: str, *, refresh: bool = False) -> pathlib.Path:
    """The path of file ``name`` (one of ``spec.files``) of ``spec``'s export, exporting first
    unless cached; raises ExportFailure (recorded, so not retried on every run) where Optimum
    cannot export the spec or wrote a file that ONNX Runtime cannot load."""
    if name not in spec.files:
        raise ValueError(f"{spec.id} has no file {name!r} (files: {spec.files})")
    export_all([spec], refresh=refresh)
    path = _found(spec)
    if path is None:
        raise FileNotFoundError(f"{spec.id} is not in the model cache {cache_dir()}")
    if path.suffix == ".failed":
        raise ExportFailure(path.read_text(encoding="utf-8").strip())
    if (path / f"{name}.failed").exists():
        raise ExportFailure((path / f"{name}.failed").read_text(encoding="utf-8").strip())
    return path / f"{name}.onnx"


def export_all(wanted: list[OptimumSpec], *, refresh: bool = False) -> None:
    """Export every spec the cache (or ``$ORT_FLASH_MODEL_PREBUILT``) lacks, in one worker
    process (its imports cost more than a tiny export)."""
    missing = [s for s in wanted if refresh or _found(s) is None]
    if not missing:
        return
    if os.environ.get("ORT_FLASH_MODEL_PREBUILT"):
        # a GPU machine verifying CI's exports is offline: building the exporter's environment
        # there would only wait out pip's retries
        raise RuntimeError(f"{', '.join(s.id for s in missing)}: not among the prebuilt exports "
                           f"in $ORT_FLASH_MODEL_PREBUILT")
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    python = venv_python()
    with tempfile.TemporaryDirectory(dir=folder, prefix=".optimum-") as scratch:
        jobs = []
        for spec in missing:
            config_class, model_class, config, _ = FAMILIES[spec.family]
            jobs.append(dict(family=spec.family, config_class=config_class,
                             model_class=model_class, config=config, task=spec.task,
                             dtype=spec.dtype, attn=spec.attn, seed=SEED,
                             shapes=SHAPES.get(spec.family, {}),
                             out=str(pathlib.Path(scratch) / cache_key(spec))))
        job_file = pathlib.Path(scratch) / "jobs.json"
        job_file.write_text(json.dumps(jobs), encoding="utf-8")
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
        run = subprocess.run([str(python), str(WORKER), str(job_file)], env=env,
                             capture_output=True, text=True, timeout=TIMEOUT)
        if run.returncode != 0:
            raise RuntimeError(f"{WORKER.name} exited {run.returncode}: {run.stderr[-2000:]}")
        for spec, job in zip(missing, jobs):
            _store(spec, pathlib.Path(job["out"]), folder)


def _store(spec: OptimumSpec, out: pathlib.Path, folder: pathlib.Path) -> None:
    """Move one job's output into the cache: the folder, with a ``<file>.failed`` record beside
    each file ONNX Runtime cannot load (the others stay usable); or, where Optimum failed or left
    out a file, a ``.failed`` record of the spec."""
    key = cache_key(spec)
    failure = (out / "FAILED").read_text(encoding="utf-8").strip() if (out / "FAILED").exists() else None
    if failure is None:
        absent = [f for f in spec.files if not (out / f"{f}.onnx").exists()]
        if absent:
            written = sorted(p.stem for p in out.glob("*.onnx"))
            failure = f"Optimum wrote {written}, not {absent}"
    target = folder / key
    if failure is not None:
        tmp = folder / f".{key}.{os.getpid()}.failed"
        tmp.write_text(f"{spec.id}: {failure.replace(str(out), key)}\n", encoding="utf-8")
        os.replace(tmp, folder / f"{key}.failed")
        shutil.rmtree(target, ignore_errors=True)
        return
    for name in spec.files:
        reason = _load_failure(out / f"{name}.onnx")
        if reason is not None:
            (out / f"{name}.failed").write_text(f"{spec.id}/{name}: {reason}\n", encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    (folder / f"{key}.failed").unlink(missing_ok=True)
    try:
        os.replace(out, target)  # a directory rename: atomic, and refused onto a filled one
    except OSError:
        if not target.is_dir():  # another process stored the same key meanwhile: keep that
            raise


def _load_failure(path: pathlib.Path) -> str | None:
    """Why ONNX Runtime (CPU, no graph optimizations) cannot load an exported file, or None."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime's errors have no common base class
        text = " ".join(str(e).split()).replace(str(path.parent), "")
        return f"ONNX Runtime cannot load the file Optimum wrote: {text[:600]}"
    return None


def _found(spec: OptimumSpec) -> pathlib.Path | None:
    """The cached folder or ``.failed`` record of ``spec`` (this key, else a prebuilt one)."""
    key = cache_key(spec)
    for path in (cache_dir() / key, cache_dir() / f"{key}.failed"):
        if path.exists():
            return path
    prebuilt = os.environ.get("ORT_FLASH_MODEL_PREBUILT")
    if prebuilt and pathlib.Path(prebuilt).is_dir():
        # exports CI made (another environment's key): a GPU machine verifies those files
        pattern = re.compile(rf"{re.escape(spec.id)}-[0-9a-f]{{12}}(\.failed)?")
        found = [p for p in pathlib.Path(prebuilt).iterdir() if pattern.fullmatch(p.name)]
        if found:
            return max(found, key=lambda p: p.stat().st_mtime)
    return None


def venv_dir() -> pathlib.Path:
    default = pathlib.Path.home() / ".cache" / "ort_flash" / "optimum-venv"
    return pathlib.Path(os.environ.get("ORT_FLASH_OPTIMUM_VENV", default))


def venv_ready() -> bool:
    """Whether the pinned exporter environment is built (``venv_python`` would not build it)."""
    root = venv_dir()
    try:
        marker = json.loads((root / "ort_flash-pinned.json").read_text())
        return marker["pinned"] == _pinned() and (root / "bin" / "python").exists()
    except (OSError, ValueError, KeyError, TypeError):
        return False


def missing_export(spec: OptimumSpec) -> str | None:
    """Why ``export`` of ``spec`` cannot return here without building the exporter's environment,
    in one line; None where the export is cached, prebuilt, or made by the exporter environment
    already built. The CUDA tests ask first: a GPU machine is often offline, where building the
    environment would only wait out pip's retries."""
    if _found(spec) is not None:
        return None
    prebuilt = os.environ.get("ORT_FLASH_MODEL_PREBUILT")
    if prebuilt:
        where = "" if pathlib.Path(prebuilt).is_dir() else ", which is no folder"
        return f"{spec.id} is not among the prebuilt exports in ORT_FLASH_MODEL_PREBUILT={prebuilt}{where}"
    if venv_ready():
        return None
    return (f"no export of {spec.id} here: the Optimum exporter's environment ({venv_dir()}) is not "
            "built, and ORT_FLASH_MODEL_PREBUILT names no folder of prebuilt exports")


def venv_python() -> pathlib.Path:
    """The pinned environment's Python, building the environment first (once; under a lock, so
    concurrent callers wait) where it is absent or pins other versions. Its marker file holds
    the pinned requirements and the seconds the build took."""
    root = venv_dir()
    python = root / "bin" / "python"
    marker = root / "ort_flash-pinned.json"
    wanted = _pinned()
    if venv_ready():
        return python
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if venv_ready():
            return python
        shutil.rmtree(root, ignore_errors=True)
        start = time.monotonic()
        env = dict(os.environ)
        env.setdefault("PIP_RETRIES", "10")  # as .ci/run sets them: retry a slow download
        env.setdefault("PIP_TIMEOUT", "60")
        for command in ([sys.executable, "-m", "venv", str(root)],
                        [str(python), "-m", "pip", "install", "-q", "-r", str(CONSTRAINTS)]):
            run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT)
            if run.returncode != 0:
                tail = "\n".join(line for line in (run.stdout + run.stderr).splitlines()
                                 if not line.startswith("WARNING: Location"))[-2000:]
                raise RuntimeError(f"building the Optimum environment {root} failed: "
                                   f"{' '.join(command)} exited {run.returncode}:\n{tail}")
        marker.write_text(json.dumps(dict(pinned=wanted, seconds=round(time.monotonic() - start, 1))))
    return python


def _layers(family: str) -> tuple[int, int]:
    """(encoder-side, decoder-side) attention layers: (L, 0) for encoders, (0, L) for decoder-only
    models; CLIP's (vision, text) towers count as (encoder, decoder: its causal text tower)."""
    c = FAMILIES[family][2]
    if family == "clip":
        return c["vision_config"]["num_hidden_layers"], c["text_config"]["num_hidden_layers"]
    if family in ("t5",):
        return c["num_layers"], c["num_decoder_layers"]
    if family in ("bart", "whisper"):
        return c["encoder_layers"], c["decoder_layers"]
    layers = c.get("num_hidden_layers") or c.get("n_layer") or c.get("n_layers")
    return (0, layers) if FAMILIES[family][3] == DECODER_TASKS else (layers, 0)


def attention_sites(spec: OptimumSpec, name: str) -> dict[str, int]:
    """What file ``name`` of ``spec`` holds: ``sites`` (Softmax / Attention nodes, subgraphs
    included), ``causal`` (causal self-attentions), ``cached`` (self-attentions that read a
    KV cache input: a with-past file's, the cache branch of a merged decoder's)."""
    encoder, decoder = _layers(spec.family)
    if name == "model":  # encoder, decoder-only or CLIP (both towers)
        cached = decoder if spec.past else 0
        return dict(sites=encoder + decoder, causal=decoder, cached=cached)
    if name == "encoder_model":
        return dict(sites=encoder, causal=0, cached=0)
    per_branch = dict(sites=2 * decoder, causal=decoder)  # self + cross per decoder layer
    if name == "decoder_model":
        return dict(per_branch, cached=0)
    if name == "decoder_with_past_model":
        return dict(per_branch, cached=decoder)
    if name == "decoder_model_merged":  # both decoders, one per If branch
        return dict(sites=4 * decoder, causal=2 * decoder, cached=decoder)
    raise ValueError(f"{spec.id} has no file {name!r} (files: {spec.files})")
