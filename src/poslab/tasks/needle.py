"""Single needle in a haystack with numbers (RULER's niah_single with numeric values): a key of
`min_digits`..`max_digits` digits is stated once at a chosen depth of filler text that holds
other numbers of the same lengths before and after it; the question closes the example and the
answer is the key and a full stop (its length is part of the answer):

    the room is 3 9 . ... the pass key is 4 7 1 . ... there are 5 5 apples .
    what is the pass key ? 4 7 1 .

Depth 0 puts the key first (the farthest from the question), depth 1 last (one number sentence
still lies between it and the question). Training draws the depth; evaluation measures every
depth of `eval_depths`. The shortcut-prone predecessor is `passkey` (no numbers in its filler).
"""

from __future__ import annotations

import numpy as np

from poslab.tasks.haystack import Haystack, numbers_in


class Needle(Haystack):
    name = "needle"

    def __init__(
        self,
        min_digits: int = 2,
        max_digits: int = 4,
        eval_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0),
    ) -> None:
        super().__init__(min_digits, max_digits, eval_depths, words=("pass", "key", "what"))
        self.statement = self.encode("the pass key is")
        self.question = self.encode("what is the pass key ?")

    def longest_needles(self) -> int:
        key = self.max_digits + 1
        return len(self.statement) + key + len(self.question) + key

    def needles_and_question(self, rng: np.random.Generator, condition: dict) -> tuple:
        key = self.number(rng)
        depth = condition.get("depth")
        if depth is None:
            depth = float(rng.random())
            condition["depth"] = depth
        needle = [*self.statement, *key, self.full_stop]
        return [needle], [depth], self.question, [*key, self.full_stop]

    def conditions(self) -> list[dict]:
        return [{"depth": d} for d in self.eval_depths]

    def solve(self, prompt: np.ndarray) -> np.ndarray:
        """The number after the statement "the pass key is"."""
        n = len(self.statement)
        for i in range(len(prompt) - n):
            if prompt[i : i + n].tolist() == self.statement:
                return self.answer_of(numbers_in(prompt[i + n :], self.digit_set)[:1])
        return self.answer_of([])
