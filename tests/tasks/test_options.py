"""Task options refuse booleans and non-lists (ConfigError naming data.task.KEY)."""

from __future__ import annotations

import re

import pytest

from poslab.errors import ConfigError
from poslab.tasks.assoc_recall import AssocRecall
from poslab.tasks.copy import Copy
from poslab.tasks.grid import Grid
from poslab.tasks.passkey import Passkey


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: Passkey(digits=True), "data.task.digits=true"),
        (lambda: Passkey(eval_depths=0.5), "data.task.eval_depths=0.5 must be a list"),
        (lambda: Copy(symbols=True), "data.task.symbols=true"),
        (lambda: Grid(colors=True), "data.task.colors=true"),
        (lambda: Grid(shifts=[]), "data.task.shifts=[] must not be empty"),
        (lambda: AssocRecall(pairs=True), "data.task.pairs=true"),
    ],
)
def test_task_options_refuse_booleans_and_non_lists(make, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        make()
