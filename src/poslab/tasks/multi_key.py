"""Multi-key needles (RULER's niah_multikey): `keys` needles "key k3 is 4 7 1 ." with distinct
key names stand at random depths of the haystack; the question asks one of them:

    ... key k3 is 4 7 1 . ... key k9 is 0 5 . ... what is key k3 ? 4 7 1 .

The other needles are the hard distractors: same form, same number lengths. A model that finds
needles but does not bind a key to its value scores 1/keys (any fixed needle: the first, the
last), which is this task's stated shortcut margin (+ 0.05).
"""

from __future__ import annotations

import numpy as np

from poslab.checks import integer, require
from poslab.tasks.haystack import Haystack, numbers_in


class MultiKey(Haystack):
    name = "multi_key"

    def __init__(
        self, keys: int = 3, names: int = 16, min_digits: int = 2, max_digits: int = 4
    ) -> None:
        require("data.task.keys", keys, integer(1))
        require("data.task.names", names, integer(keys))
        self.keys, self.names = keys, names
        self.key_words = [f"k{i}" for i in range(names)]
        super().__init__(
            min_digits, max_digits, (0.5,), words=("key", "keys", "what", "are", *self.key_words)
        )
        self.key_ids = np.array([self.ids[w] for w in self.key_words])
        self.shortcut_margin = 1 / keys + 0.05

    def longest_needles(self) -> int:
        needle = 3 + self.max_digits + 1  # key k is <n> .
        return self.keys * needle + 5 + self.max_digits + 1  # what is key k ? <n> .

    def needle(self, key: int, value: list[int]) -> list[int]:
        return [self.ids["key"], key, self.ids["is"], *value, self.full_stop]

    def needles_and_question(self, rng: np.random.Generator, condition: dict) -> tuple:
        keys = rng.choice(self.key_ids, self.keys, replace=False).tolist()
        values = self.distinct_numbers(rng, self.keys)
        asked = int(rng.integers(self.keys))
        needles = [self.needle(k, v) for k, v in zip(keys, values, strict=True)]
        question = [*self.encode("what is key"), keys[asked], self.ids["?"]]
        return needles, [None] * self.keys, question, [*values[asked], self.full_stop]

    def distinct_numbers(self, rng: np.random.Generator, count: int) -> list[list[int]]:
        numbers: list[list[int]] = []
        while len(numbers) < count:
            n = self.number(rng, avoid=frozenset(tuple(m) for m in numbers))
            numbers.append(n)
        return numbers

    def needle_values(self, prompt: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(key id, value) of every needle in the haystack, in order."""
        found = []
        for i in np.flatnonzero(prompt[: self.question_start(prompt)] == self.ids["key"]):
            if i + 2 < len(prompt) and prompt[i + 2] == self.ids["is"]:
                value = numbers_in(prompt[i + 3 :], self.digit_set)
                found.append((int(prompt[i + 1]), value[0] if value else np.array([])))
        return found

    def solve(self, prompt: np.ndarray) -> np.ndarray:
        """The value of the needle whose key the question names."""
        asked = int(prompt[self.question_start(prompt) + 3])
        return self.answer_of([v for k, v in self.needle_values(prompt) if k == asked][:1])

    def prompt_shortcuts(self) -> dict:
        def needle_at(index: int):  # noqa: ANN202 - a predictor: the value of one needle
            def predict(prompt: np.ndarray, size: int) -> np.ndarray:
                values = self.needle_values(prompt)
                return self.answer_of([values[index][1]] if values else [])

            return predict

        return {
            **self.number_shortcuts(),
            "the first needle's value": needle_at(0),
            "the last needle's value": needle_at(-1),
        }
