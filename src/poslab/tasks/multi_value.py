"""Multi-value needles (RULER's niah_multivalue): the pass key is stated `values` times with
different values at random depths; the question asks for all of them, in order of appearance:

    ... the pass key is 4 7 . ... the pass key is 9 1 3 . ... what are the pass keys ? 4 7 , 9 1 3 .

The haystack's other numbers (first and last sentence included) are the distractors; "the last
`values` numbers" or "the first ones" are stated shortcuts and score ~0.
"""

from __future__ import annotations

import numpy as np

from poslab.checks import integer, require
from poslab.tasks.haystack import Haystack, numbers_in


class MultiValue(Haystack):
    name = "multi_value"

    def __init__(self, values: int = 2, min_digits: int = 2, max_digits: int = 4) -> None:
        require("data.task.values", values, integer(1))
        self.values = values
        super().__init__(
            min_digits, max_digits, (0.5,), words=("pass", "key", "keys", "what", "are")
        )
        self.statement = self.encode("the pass key is")
        self.question = self.encode("what are the pass keys ?")

    def longest_needles(self) -> int:
        needle = len(self.statement) + self.max_digits + 1
        return self.values * needle + len(self.question) + self.values * (self.max_digits + 1)

    def needles_and_question(self, rng: np.random.Generator, condition: dict) -> tuple:
        values: list[list[int]] = []
        while len(values) < self.values:
            values.append(self.number(rng, avoid=frozenset(tuple(v) for v in values)))
        # depths in increasing order, so the needles appear in the order of the answer
        depths = sorted(float(d) for d in rng.random(self.values))
        needles = [[*self.statement, *v, self.full_stop] for v in values]
        return needles, depths, self.question, self.answer_of(values).tolist()

    def stated_values(self, prompt: np.ndarray) -> list[np.ndarray]:
        n, found = len(self.statement), []
        end = self.question_start(prompt)
        for i in range(end - n):
            if prompt[i : i + n].tolist() == self.statement:
                found += numbers_in(prompt[i + n :], self.digit_set)[:1]
        return found

    def solve(self, prompt: np.ndarray) -> np.ndarray:
        """Every number stated after "the pass key is", in order."""
        return self.answer_of(self.stated_values(prompt))

    def prompt_shortcuts(self) -> dict:
        def numbers(pick):  # noqa: ANN001, ANN202 - a predictor from a choice of numbers
            def predict(prompt: np.ndarray, size: int) -> np.ndarray:
                return self.answer_of(pick(self.context_numbers(prompt)))

            return predict

        return {
            **self.number_shortcuts(),
            f"the last {self.values} numbers": numbers(lambda f: f[-self.values :]),
            f"the first {self.values} numbers": numbers(lambda f: f[: self.values]),
        }
