"""Multi-query needles (RULER's niah_multiquery): `keys` needles "key k3 is 4 7 1 ." as in
multi_key, and the question asks `queries` of them at once; the answer is their values in the
order asked:

    ... key k3 is 4 7 1 . ... key k9 is 0 5 . ... what are keys k9 k3 ? 0 5 , 4 7 1 .

Stated shortcut margin: a fixed choice of needles in a fixed order (the first `queries` needles,
the last ones) is right once in keys!/(keys − queries)! arrangements (+ 0.05).
"""

from __future__ import annotations

import math

import numpy as np

from poslab.checks import integer, require
from poslab.errors import ConfigError
from poslab.tasks.multi_key import MultiKey


class MultiQuery(MultiKey):
    name = "multi_query"

    def __init__(
        self,
        keys: int = 3,
        queries: int = 2,
        names: int = 16,
        min_digits: int = 2,
        max_digits: int = 4,
    ) -> None:
        require("data.task.queries", queries, integer(1))
        if queries > keys:
            raise ConfigError(
                f"data.task.queries={queries} is more than data.task.keys={keys}; every query "
                "asks a different needle: raise keys or lower queries"
            )
        self.queries = queries
        super().__init__(keys, names, min_digits, max_digits)
        self.shortcut_margin = math.factorial(keys - queries) / math.factorial(keys) + 0.05

    def longest_needles(self) -> int:
        needle = 3 + self.max_digits + 1
        question = 4 + self.queries  # what are keys k.. ?
        return self.keys * needle + question + self.queries * (self.max_digits + 1)

    def needles_and_question(self, rng: np.random.Generator, condition: dict) -> tuple:
        keys = rng.choice(self.key_ids, self.keys, replace=False).tolist()
        values = self.distinct_numbers(rng, self.keys)
        asked = rng.choice(self.keys, self.queries, replace=False).tolist()
        needles = [self.needle(k, v) for k, v in zip(keys, values, strict=True)]
        question = [*self.encode("what are keys"), *(keys[a] for a in asked), self.ids["?"]]
        answer = self.answer_of([values[a] for a in asked]).tolist()
        return needles, [None] * self.keys, question, answer

    def solve(self, prompt: np.ndarray) -> np.ndarray:
        """The values of the asked keys' needles, in the order asked."""
        start = self.question_start(prompt) + 3
        asked = prompt[start : start + self.queries].tolist()
        values = dict(self.needle_values(prompt))
        return self.answer_of([values[k] for k in asked if k in values])

    def prompt_shortcuts(self) -> dict:
        def needles(pick):  # noqa: ANN001, ANN202 - a predictor from a choice of needles
            def predict(prompt: np.ndarray, size: int) -> np.ndarray:
                return self.answer_of([v for _, v in pick(self.needle_values(prompt))])

            return predict

        q = self.queries
        return {
            **self.number_shortcuts(),
            f"the first {q} needles' values": needles(lambda f: f[:q]),
            f"the last {q} needles' values": needles(lambda f: f[-q:]),
        }
