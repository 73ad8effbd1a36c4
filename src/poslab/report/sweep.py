"""What a `-m` sweep does when its last job ends: compare the jobs' results.

A module of its own, because Hydra builds the callback when the sweep starts: importing it must
not import torch or the comparison code, which load only once the sweep is over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback


class CompareOnMultirunEnd(Callback):
    """After a `-m` sweep, merge its jobs' results into <sweep>/comparison/."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        from poslab.report.compare import compare, find_results

        sweep = Path(config.hydra.sweep.dir)
        if find_results([sweep]):
            compare([sweep], sweep / "comparison")
