"""Copy a random string (Ruoss et al. 2023's algorithmic length-generalisation setup).

    <bos> c a f f b = c a f f b

Training examples have any string size that fits the training length (uniform), padded after
the answer; evaluation examples fill the evaluation length, so a model is tested on strings
longer than any it saw. The answer is the whole output string.
"""

from __future__ import annotations

import string

import numpy as np

from poslab.checks import integer, require
from poslab.tasks.base import Example, Task, reads_prompt


class Copy(Task):
    name = "copy"

    def __init__(self, symbols: int = 16) -> None:
        super().__init__()
        require("data.task.symbols", symbols, integer(2, 26))  # a-z; refuses true/false too
        self.vocabulary(["<bos>", "="], list(string.ascii_lowercase[:symbols]))
        self.symbol_ids = np.arange(3, 3 + symbols)

    def output(self, string_ids: np.ndarray) -> np.ndarray:
        """The answer for an input string."""
        return string_ids

    def min_length(self) -> int:
        return 3  # <bos> x = x

    def example(
        self,
        length: int,
        rng: np.random.Generator,
        condition: dict | None = None,
        train: bool = False,
    ) -> Example:
        self.check_length(length)
        longest = (length - 1) // 2  # <bos> + n + "=" + n ≤ length + 1
        n = int(rng.integers(1, longest + 1)) if train else longest
        source = rng.choice(self.symbol_ids, n)
        tokens = np.zeros(length + 1, dtype=np.int64)  # padded after the answer
        tokens[: 2 * n + 2] = [self.ids["<bos>"], *source, self.ids["="], *self.output(source)]
        answer = np.zeros(length, dtype=bool)
        answer[n + 1 : 2 * n + 1] = True  # targets n+1.. are the output tokens
        return Example(tokens, answer, {"size": n})

    def answer_symbols(self) -> list[int]:
        return self.symbol_ids.tolist()

    def source_of(self, prompt: np.ndarray) -> np.ndarray:
        """The input string of a prompt (`<bos>` string `=`)."""
        return prompt[1:-1]

    def solve(self, prompt: np.ndarray) -> np.ndarray:
        return self.output(self.source_of(prompt))

    def shortcuts(self) -> dict:
        """Guesses that do not follow the string position by position."""

        def most_frequent(prompt: np.ndarray, size: int) -> np.ndarray:
            source = self.source_of(prompt)
            return np.full(size, np.bincount(source).argmax())

        def the_other_order(prompt: np.ndarray, size: int) -> np.ndarray:
            # copy for reverse, reverse for copy: the order is the task
            return self.output(self.source_of(prompt))[::-1]

        def shifted(prompt: np.ndarray, size: int) -> np.ndarray:
            # the output one place off (the neighbour of the right symbol)
            out = self.output(self.source_of(prompt))
            return np.concatenate([out[1:], out[:1]])

        return {
            "the most frequent symbol": reads_prompt(most_frequent),
            "the string in the other order": reads_prompt(the_other_order),
            "the output shifted by one": reads_prompt(shifted),
        }
