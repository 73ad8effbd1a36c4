"""A generated 2-D dataset: grids whose rows repeat the row above, shifted (resolution
extrapolation: train on small grids, test on larger ones).

A grid of side s (the largest with s² + 1 ≤ length + 1 tokens: `<bos>` and the cells in raster
order, padding after) has a random first row of `colors` colors; every later row is the row
above shifted by the grid's `shift` (one of `shifts`, drawn per grid): cell (r, c) = cell
(r − 1, c − shift), and a new random color where c − shift falls outside the grid. The answer is
every such cell from the third row on: by then the first two rows have shown the shift (in the
second row it is still unknown, so even a perfect model would guess). Positions are (row,
column): `<bos>` at (0, 0), cell (r, c) at (r + 1, c + 1), padding at (0, 0).

Why it separates the schemes: the cell to copy is one row up and `shift` columns over, a fixed
2-D offset at any grid size, but in raster order it lies s + shift tokens back, a distance that
grows with the grid. A 2-D scheme can learn the offset once; a 1-D scheme learns the distances
of the training size.

Its best shortcut is not near chance, and the tables say so: copying one fixed offset (the cell
above, ignoring the shift the first rows show) is right for the grids of that shift and by chance
elsewhere: 1/|shifts| + (1 − 1/|shifts|)/colors per cell, ≈ 0.42 with the defaults. That, not
1/colors, is the baseline a 2-D scheme must beat.
"""

from __future__ import annotations

import math

import numpy as np

from poslab.checks import integer, list_of, require
from poslab.tasks.base import Example, Task


def grid_positions(length: int, side: int) -> np.ndarray:
    """(length + 1, 2) positions of `<bos>` and an s × s grid in raster order: (0, 0) for
    `<bos>` and the padding after the grid, (r + 1, c + 1) for cell (r, c)."""
    positions = np.zeros((length + 1, 2), dtype=np.int64)
    rows, cols = np.divmod(np.arange(side * side), side)
    positions[1 : side * side + 1] = np.stack([rows + 1, cols + 1], axis=1)
    return positions


def grid_example(
    length: int, bos: int, cells: np.ndarray, answer_cells: np.ndarray, condition: dict
) -> Example:
    """`<bos>` and an s × s grid of token ids in raster order, padded to `length` + 1 tokens;
    the answer mask of the cells (over the targets: target t is cell t) and their positions."""
    s = cells.shape[0]
    tokens = np.zeros(length + 1, dtype=np.int64)
    tokens[0] = bos
    tokens[1 : s * s + 1] = cells.ravel()
    answer = np.zeros(length, dtype=bool)
    answer[: s * s] = answer_cells.ravel()
    return Example(tokens, answer, condition, grid_positions(length, s))


class Grid(Task):
    name = "grid"
    position_axes = 2

    def __init__(self, colors: int = 8, shifts: tuple[int, ...] = (-1, 0, 1)) -> None:
        super().__init__()
        require("data.task.colors", colors, integer(2))  # refuses true/false too
        require("data.task.shifts", shifts, list_of(integer(-2, 2)))
        self.shifts = list(shifts)
        # copying one fixed offset gets a whole grid right when the grid has that shift
        self.shortcut_margin = 1 / len(set(self.shifts)) + 0.1
        self.vocabulary(["<bos>"], [f"c{i}" for i in range(colors)])
        self.color_ids = np.arange(2, 2 + colors)

    @staticmethod
    def side(length: int) -> int:
        return math.isqrt(length)

    def min_length(self) -> int:
        return 9  # a 3 × 3 grid: its third row has cells to predict

    def max_position(self, length: int) -> int:
        return self.side(length)  # the last row and column

    def example(
        self,
        length: int,
        rng: np.random.Generator,
        condition: dict | None = None,
        train: bool = False,
    ) -> Example:
        self.check_length(length)
        s = self.side(length)
        shift = int(rng.choice(self.shifts))
        grid = np.empty((s, s), dtype=np.int64)
        grid[0] = rng.choice(self.color_ids, s)
        predictable = np.zeros((s, s), dtype=bool)
        columns = np.arange(s)
        source = columns - shift
        inside = (source >= 0) & (source < s)
        for r in range(1, s):
            grid[r] = rng.choice(self.color_ids, s)  # the cells entering at the border
            grid[r, inside] = grid[r - 1, source[inside]]
            predictable[r] = inside if r >= 2 else False  # row 1: the shift is not known yet
        condition = {"side": s, "shift": shift}
        return grid_example(length, self.ids["<bos>"], grid, predictable, condition)

    def answer_symbols(self) -> list[int]:
        return self.color_ids.tolist()

    def cells(self, example: Example) -> np.ndarray:
        s = example.condition["side"]
        return example.tokens[1 : s * s + 1].reshape(s, s)

    def solve(self, prompt: np.ndarray) -> np.ndarray:
        raise NotImplementedError("grid answers are teacher-forced cells: see `oracle`")

    def oracle(self, example: Example) -> np.ndarray:
        """Every answer cell from the row above, shifted by the shift rows 0 and 1 show (the
        first shift that explains row 1; a model can do no better)."""
        grid = self.cells(example)
        s = grid.shape[0]
        columns = np.arange(s)
        fits = [
            k
            for k in self.shifts
            if all(grid[1, c] == grid[0, c - k] for c in columns if 0 <= c - k < s)
        ]
        return self.copy_from(example, fits[0] if fits else 0)

    def copy_from(self, example: Example, shift: int) -> np.ndarray:
        """The answer cells guessed as cell (r − 1, c − shift) (the teacher-forced row above)."""
        grid = self.cells(example)
        s = grid.shape[0]
        guess = np.zeros_like(grid)
        source = np.clip(np.arange(s) - shift, 0, s - 1)
        guess[1:] = grid[:-1, source]
        answer = example.answer[: s * s].reshape(s, s)
        return guess[answer]

    def shortcuts(self) -> dict:
        """Copy one fixed offset whatever the grid's shift (shift 0: the cell above)."""
        return {
            f"the cell one row up, {k:+d} column(s)" if k else "the cell above": (
                lambda example, k=k: self.copy_from(example, k)
            )
            for k in self.shifts
        }
