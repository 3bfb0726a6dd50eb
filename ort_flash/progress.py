"""What a long ``rewrite`` or ``verify`` is doing, on stderr, for a person at a terminal.

``Progress(enabled)`` is called as ``progress(stage, done=None, total=None)``: a stage with a
total shows a bar (fusing 12/16 attention nodes), one without shows its name and the time
spent. Disabled (stderr not a terminal, or a ``--json`` run) it does nothing, so pipes, logs and
machine-read runs see only the command's own output.
"""

from __future__ import annotations

import sys


def wanted(json_run: bool = False) -> bool:
    return not json_run and sys.stderr.isatty()


class Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar = None
        self._stage = None

    def __call__(self, stage: str, done: int | None = None, total: int | None = None) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        if stage != self._stage or (total is not None and self._bar.total != total):
            self.close()
            self._stage = stage
            bar_format = ("{desc}: {n}/{total} {bar} [{elapsed}]" if total
                          else "{desc} [{elapsed}]")
            self._bar = tqdm(total=total or None, desc=f"ort-flash: {stage}", file=sys.stderr,
                             leave=False, bar_format=bar_format, dynamic_ncols=True)
        if done is not None:
            self._bar.n = done
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._stage = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
