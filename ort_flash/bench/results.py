"""The result document: one JSON file per ``ort-flash bench`` run, written after every
configuration (a run cut short by its time limit still leaves what it measured).

    {
      "schema": "ort_flash.bench/1",
      "created": "<UTC ISO date>",
      "command": "<argv>",
      "environment": {date, device, host, gpu, versions, git},   # environment.describe
      "ceilings": {matmul_tflops, copy_tbps, source, ...},        # ceilings.measure
      "suites": {
        "<op|decode|e2e|decode_e2e|cpu|gqa|genai>": {
          "device": "cuda" | "cpu", "status": "complete" | "partial" | "failed",
          "elapsed_s": float, "budget_s": float | null, "grid": {...}, "notes": [str],
          "rows": [{"config": {...}, "peer": str, "status": "ok" | "unsupported" | "error" |
                    "mismatch", "reason"?: str, "ms"?: float, ...suite metrics...}],
          "not_run": [config, ...]                                  # cut by the time budget
        }
      }
    }
"""
from __future__ import annotations

import datetime
import json
import math
import os
import pathlib
import sys

SCHEMA = "ort_flash.bench/1"
SUITES = ("op", "decode", "e2e", "decode_e2e", "cpu", "gqa", "genai", "genai_fidelity")
UNTIMED = ("genai_fidelity",)  # suites whose rows are checks, not times
ROW_STATUS = ("ok", "unsupported", "error", "mismatch")
SUITE_STATUS = ("complete", "partial", "failed", "running")


def new_document(environment: dict, ceilings: dict | None, args: dict | None = None) -> dict:
    return {
        "schema": SCHEMA,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "args": args or {},
        "environment": environment,
        "ceilings": ceilings or {},
        "suites": {},
    }


def new_suite(device: str, grid: dict, budget_s: float | None) -> dict:
    return {"device": device, "status": "running", "elapsed_s": 0.0, "budget_s": budget_s,
            "grid": grid, "notes": [], "rows": [], "not_run": []}


def save(doc: dict, path: str | os.PathLike | None) -> None:
    """Atomic write (a reader never sees half a file); no-op without a path."""
    if not path:
        return
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_finite(doc), indent=1, default=_jsonable, allow_nan=False) + "\n")
    os.replace(tmp, path)


def _finite(x):
    """NaN and infinities (a wrong peer's error, say) as strings: JSON has no such numbers."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _jsonable(x):
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


def load(path: str | os.PathLike) -> dict:
    doc = json.loads(pathlib.Path(path).read_text())
    problems = validate(doc)
    if problems:
        raise ValueError(f"{path}: not an ort_flash benchmark result: " + "; ".join(problems[:5]))
    return doc


def validate(doc: dict) -> list[str]:
    """Problems with ``doc`` against the schema above (empty when it conforms)."""
    problems = []
    if doc.get("schema") != SCHEMA:
        problems.append(f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}")
    for key in ("created", "environment", "ceilings", "suites"):
        if key not in doc:
            problems.append(f"missing {key!r}")
    env = doc.get("environment", {})
    for key in ("date", "device", "versions", "git"):
        if key not in env:
            problems.append(f"environment lacks {key!r}")
    for name, suite in doc.get("suites", {}).items():
        if name not in SUITES:
            problems.append(f"unknown suite {name!r}")
        for key in ("device", "status", "rows", "grid", "not_run"):
            if key not in suite:
                problems.append(f"suite {name} lacks {key!r}")
        if suite.get("status") not in SUITE_STATUS:
            problems.append(f"suite {name} has status {suite.get('status')!r}")
        for i, row in enumerate(suite.get("rows", [])):
            for key in ("config", "peer", "status"):
                if key not in row:
                    problems.append(f"suite {name} row {i} lacks {key!r}")
            if row.get("status") not in ROW_STATUS:
                problems.append(f"suite {name} row {i} has status {row.get('status')!r}")
            if row.get("status") == "ok" and name not in UNTIMED and not isinstance(row.get("ms"), (int, float)):
                problems.append(f"suite {name} row {i} is ok without a time")
            if row.get("status") != "ok" and not row.get("reason"):
                problems.append(f"suite {name} row {i} is {row.get('status')} without a reason")
    return problems


def config_key(config: dict) -> tuple:
    return tuple(sorted(config.items()))


def group_by_config(rows: list[dict]) -> list[tuple[dict, list[dict]]]:
    """[(config, its rows)] in first-seen order."""
    groups: dict[tuple, tuple[dict, list]] = {}
    for r in rows:
        groups.setdefault(config_key(r["config"]), (r["config"], []))[1].append(r)
    return list(groups.values())


def format_reasons(rows: list[dict]) -> str:
    """Why peers have no number: one line per (peer, status, reason) with a count."""
    counts: dict[tuple, int] = {}
    for r in rows:
        if r.get("status") != "ok":
            key = (r["peer"], r["status"], r.get("reason") or "")
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        return ""
    lines = ["peers without a number (count of configurations):"]
    lines += [f"  {peer}: {status} x{n}: {reason}" for (peer, status, reason), n in counts.items()]
    return "\n".join(lines)
