"""Single needle in a haystack with numbers (RULER's niah_single with numeric values): a key of
`min_digits`..`max_digits` digits is stated once at a chosen depth of filler text that holds
other numbers of the key's length before and after it; the question closes the example and the
answer is the key and a full stop:

    the room is 3 9 1 . ... the pass key is 4 7 1 . ... there are 5 5 0 apples .
    what is the pass key ? 4 7 1 .

Depth 0 puts the key first after the one or two opening number sentences (the farthest from the
question), depth 1 last (one or two number sentences still lie between it and the question).
Training draws the depth; evaluation measures every depth of `eval_depths`. The shortcut-prone
predecessor is `passkey` (no numbers in its filler).

Its best shortcut is an index guess (the third number, the second from the end, ...): a
64-token haystack holds only 4 to 6 numbers and the key is never the first or the last, so such
a guess is right in up to a third of examples at 64 tokens and about 0.1 from 128 on
(`shortcut_margin` 0.4 bounds it). The tables print it as the best-shortcut row; a model that
learned the task at L (accuracy ≥ 0.9) is far above it.
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
        self.shortcut_margin = 0.4  # an index guess among a short haystack's numbers (above)

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
