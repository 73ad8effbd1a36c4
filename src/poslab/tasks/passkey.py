"""Passkey retrieval (Mohtashami & Jaggi 2023; the PI and YaRN papers' long-context test).

A key of `digits` random digits is stated once at a chosen depth of a repetitive filler text;
the example ends with the question, and the answer is the key:

    ... the sky is blue . the pass key is 7 1 4 0 9 . here we go . ...
    what is the pass key ? 7 1 4 0 9

Depth 0 puts the key at the start (the farthest from the question), depth 1 right before it.
Training draws the depth uniformly; evaluation measures every depth of `eval_depths`.

Shortcut-prone, kept for comparison with the papers that use it: the filler holds no digits, so
"copy the digits before the question" (or "every digit in the text") solves it at any length
without retrieving anything (a CoPE model learned exactly that: layer-1 gates ≈ 1 on digits, 0
elsewhere). Use `data=needle` (poslab/tasks/needle.py), whose filler holds numbers.
"""

from __future__ import annotations

import numpy as np

from poslab.checks import integer, list_of, number, require
from poslab.tasks.base import Example, Task, reads_prompt

FILLER = (
    "the grass is green . the sky is blue . the sun is yellow . here we go . there and back again ."
)
DIGITS = [str(d) for d in range(10)]


class Passkey(Task):
    name = "passkey"
    shortcut_prone = True  # see the module docstring: every digit of the text is the key

    def __init__(
        self, digits: int = 5, eval_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    ) -> None:
        super().__init__()
        require("data.task.digits", digits, integer(1))  # refuses true/false, unlike isinstance
        require("data.task.eval_depths", eval_depths, list_of(number(ge=0, le=1)))
        self.digits = digits
        self.eval_depths = [float(d) for d in eval_depths]
        words = sorted(set(FILLER.split()) | {"pass", "key", "what", "?"})
        self.vocabulary(DIGITS, words)
        self.statement = self.encode("the pass key is")
        self.question = self.encode("what is the pass key ?")
        self.filler = np.array(self.encode(FILLER))
        self.full_stop = self.ids["."]

    def min_length(self) -> int:
        # statement + key + "." + question + key; no filler at all
        return len(self.statement) + 2 * self.digits + 1 + len(self.question) - 1

    def example(
        self,
        length: int,
        rng: np.random.Generator,
        condition: dict | None = None,
        train: bool = False,
    ) -> Example:
        self.check_length(length)
        depth = (condition or {}).get("depth")
        if depth is None:
            depth = float(rng.random())
        key = [self.ids[d] for d in rng.integers(0, 10, self.digits).astype(str)]
        filler_total = length + 1 - self.min_length() - 1
        before = int(round(depth * filler_total))
        start = int(rng.integers(len(self.filler)))  # where in the filler text it begins
        text = np.resize(np.roll(self.filler, -start), filler_total)
        tokens = [
            *text[:before],
            *self.statement,
            *key,
            self.full_stop,
            *text[before:],
            *self.question,
            *key,
        ]
        answer = np.zeros(length, dtype=bool)
        answer[-self.digits :] = True
        return Example(np.asarray(tokens, dtype=np.int64), answer, {"depth": depth})

    def conditions(self) -> list[dict]:
        return [{"depth": d} for d in self.eval_depths]

    def answer_symbols(self) -> list[int]:
        return [self.ids[d] for d in DIGITS]

    def solve(self, prompt: np.ndarray) -> np.ndarray:
        """The digits after "the pass key is"."""
        n = len(self.statement)
        for i in range(len(prompt) - n):
            if prompt[i : i + n].tolist() == self.statement:
                return prompt[i + n : i + n + self.digits]
        return np.zeros(0, dtype=np.int64)

    def shortcuts(self) -> dict:
        digit_ids = set(self.answer_symbols())

        def every_digit(prompt: np.ndarray, size: int) -> np.ndarray:
            return np.asarray([t for t in prompt.tolist() if t in digit_ids][:size])

        def before_question(prompt: np.ndarray, size: int) -> np.ndarray:
            start = len(prompt) - len(self.question)
            return np.asarray([t for t in prompt[:start].tolist() if t in digit_ids][-size:])

        return {
            "every digit in the text": reads_prompt(every_digit),
            "the digits before the question": reads_prompt(before_question),
        }
