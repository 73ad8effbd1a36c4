"""Multi-query associative recall (Arora et al. 2023, HazyResearch/zoology's MQAR), with the
queries at the end of the sequence so that the distance to the pairs grows with its length.

`pairs` key–value pairs with distinct keys open the example, random noise tokens fill the
middle, and `queries` of the keys (distinct, in random order) close it, each followed by its
value, which is the answer:

    k3 v7 k9 v1 k0 v4 ... n2 n5 n0 ... k9 v1 k3 v7
"""

from __future__ import annotations

import numpy as np

from poslab.checks import integer, require
from poslab.errors import ConfigError
from poslab.tasks.base import Example, Task, reads_prompt


class AssocRecall(Task):
    name = "assoc_recall"

    def __init__(
        self, pairs: int = 8, queries: int = 4, keys: int = 32, values: int = 32, noise: int = 16
    ) -> None:
        super().__init__()
        for key, value, low in (
            ("pairs", pairs, 1),
            ("queries", queries, 1),
            ("keys", keys, 1),
            ("values", values, 2),
            ("noise", noise, 1),
        ):
            require(f"data.task.{key}", value, integer(low))  # refuses true/false too
        if keys < pairs or queries > pairs:
            raise ConfigError(
                f"data.task: needs keys ≥ pairs ≥ queries (distinct keys, each queried once); "
                f"got keys={keys}, pairs={pairs}, queries={queries}"
            )
        self.pairs, self.queries = pairs, queries
        self.vocabulary(
            [f"k{i}" for i in range(keys)],
            [f"v{i}" for i in range(values)],
            [f"n{i}" for i in range(noise)],
        )
        self.key_ids = np.array([self.ids[f"k{i}"] for i in range(keys)])
        self.value_ids = np.array([self.ids[f"v{i}"] for i in range(values)])
        self.noise_ids = np.array([self.ids[f"n{i}"] for i in range(noise)])

    def min_length(self) -> int:
        return 2 * self.pairs + 2 * self.queries - 1

    def example(
        self,
        length: int,
        rng: np.random.Generator,
        condition: dict | None = None,
        train: bool = False,
    ) -> Example:
        self.check_length(length)
        keys = rng.choice(self.key_ids, self.pairs, replace=False)
        values = rng.choice(self.value_ids, self.pairs)  # values may repeat, keys do not
        asked = rng.choice(self.pairs, self.queries, replace=False)
        gap = length + 1 - 2 * self.pairs - 2 * self.queries
        parts = [
            np.stack([keys, values], 1).ravel(),
            rng.choice(self.noise_ids, gap),
            np.stack([keys[asked], values[asked]], 1).ravel(),
        ]
        tokens = np.concatenate(parts).astype(np.int64)
        answer = np.zeros(length, dtype=bool)
        answer[length - 2 * self.queries + 1 :: 2] = True  # the targets that are values
        return Example(tokens, answer)

    def answer_symbols(self) -> list[int]:
        return self.value_ids.tolist()

    def solve(self, prompt: np.ndarray) -> np.ndarray:
        """Not defined on a prompt alone (the answer is teacher-forced query by query)."""
        raise NotImplementedError("assoc_recall answers are teacher-forced: see `oracle`")

    def oracle(self, example: Example) -> np.ndarray:
        """Each queried key's value, read from the pairs that open the example."""
        tokens = example.tokens
        pairs = dict(
            zip(tokens[0 : 2 * self.pairs : 2], tokens[1 : 2 * self.pairs : 2], strict=True)
        )
        queried = tokens[len(tokens) - 2 * self.queries :: 2]
        return np.asarray([pairs[k] for k in queried])

    def shortcuts(self) -> dict:
        """Values of fixed pairs, whatever the key asked."""

        def pair_values(example: Example, pick: slice) -> np.ndarray:
            values = example.tokens[1 : 2 * self.pairs : 2]
            return np.resize(values[pick], self.queries)

        def most_frequent(prompt: np.ndarray, size: int) -> np.ndarray:
            values = prompt[1 : 2 * self.pairs : 2]
            return np.full(size, np.bincount(values).argmax())

        return {
            "the first pairs' values": lambda e: pair_values(e, slice(0, None)),
            "the last pairs' values": lambda e: pair_values(e, slice(-self.queries, None)),
            "the most frequent value": reads_prompt(most_frequent),
        }
