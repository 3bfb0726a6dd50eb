"""Export jobs with Hugging Face Optimum, run by the pinned environment's Python (never imported).

    <optimum-venv>/bin/python lab/models/optimum_worker.py jobs.json

``lab/models/optimum_family.py`` writes the jobs and runs this file in the environment that
``.ci/optimum-constraints.txt`` pins (optimum-onnx needs transformers < 4.58, the dev venv has
5.x), so this file imports nothing of ort_flash. ``jobs.json`` is a list of
``{"family", "model_class", "config_class", "config", "task", "dtype", "attn", "out", "seed",
"shapes"}`` (shapes: main_export's dummy-input sizes, e.g. Whisper's ``nb_max_frames``);
for each job: a tiny random model (``torch.manual_seed(seed)``, the config's class and
arguments) is saved to a folder with ``save_pretrained`` and exported from that folder with
``optimum.exporters.onnx.main_export`` into ``out`` (no hub: ``local_files_only``). Optimum's
own validation is off (the caller loads and runs every file in ONNX Runtime itself). A job the
exporter cannot do writes ``out/FAILED`` with the exception on one line; the rest go on.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import sys
import tempfile
import traceback


def _export(job: dict) -> None:
    import torch
    import transformers
    from optimum.exporters.onnx import main_export
    from optimum.exporters.tasks import TasksManager

    torch.manual_seed(job["seed"])
    config = getattr(transformers, job["config_class"])(**job["config"])
    model = getattr(transformers, job["model_class"])(config).eval()
    out = pathlib.Path(job["out"])
    with tempfile.TemporaryDirectory() as folder, _attention(TasksManager, job["attn"]):
        model.save_pretrained(folder)
        torch.manual_seed(job["seed"])  # weights a task's head class adds are seeded too
        main_export(folder, out, task=job["task"], dtype={"float32": "fp32", "float16": "fp16"}[
            job["dtype"]], do_validation=False, local_files_only=True,
            library_name="transformers", **job.get("shapes", {}))


@contextlib.contextmanager
def _attention(tasks_manager, attn: str):
    """Load the model with ``attn_implementation=attn``: main_export takes no such argument
    (transformers 4.57 picks sdpa where the model has it, as a user's export gets), so the
    eager variants pass it through the TasksManager call that loads the model."""
    if attn == "default":
        yield
        return
    original = tasks_manager.get_model_from_task

    def load(*args, **kwargs):
        return original(*args, **kwargs, attn_implementation=attn)

    tasks_manager.get_model_from_task = load
    try:
        yield
    finally:
        tasks_manager.get_model_from_task = original


def main(argv: list[str]) -> int:
    jobs = json.loads(pathlib.Path(argv[1]).read_text(encoding="utf-8"))
    for job in jobs:
        out = pathlib.Path(job["out"])
        out.mkdir(parents=True, exist_ok=True)
        try:
            _export(job)
            print(f"exported {out.name}", flush=True)
        except Exception as e:  # noqa: BLE001 - every exporter error becomes one recorded failure
            text = " ".join(f"{type(e).__name__}: {e}".split())[:700]
            (out / "FAILED").write_text(text + "\n", encoding="utf-8")
            traceback.print_exc()
            print(f"failed {out.name}: {text}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
