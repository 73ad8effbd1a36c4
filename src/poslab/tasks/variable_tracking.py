"""Variable tracking (RULER's vt): `chains` chains of assignments are spread through the haystack,
each starting from its own number and passing it on `hops` times; the question gives one chain's
number and asks which variables hold it, in order of assignment:

    ... x3 = 5 7 . ... x9 = 4 1 2 . ... x0 = x3 . ... x5 = x9 . ... x7 = x0 . ...
    which variables are 5 7 ? x3 x0 x7 .

Why several chains: with one, "every variable in the text" solves it. A model that lists one
chain without reading the number scores 1/chains (the first chain, the last): the stated margin
(+ 0.05).
"""

from __future__ import annotations

import numpy as np

from poslab.checks import integer, require
from poslab.tasks.haystack import Haystack, numbers_in


class VariableTracking(Haystack):
    name = "variable_tracking"

    def __init__(
        self,
        chains: int = 2,
        hops: int = 2,
        names: int = 16,
        min_digits: int = 2,
        max_digits: int = 4,
    ) -> None:
        require("data.task.chains", chains, integer(1))
        require("data.task.hops", hops, integer(1))
        require("data.task.names", names, integer(chains * (hops + 1)))
        self.chains, self.hops = chains, hops
        self.var_words = [f"x{i}" for i in range(names)]
        super().__init__(
            min_digits, max_digits, (0.5,), words=("which", "variables", "are", *self.var_words)
        )
        self.var_ids = np.array([self.ids[w] for w in self.var_words])
        self.var_set = set(self.var_ids.tolist())
        self.shortcut_margin = 1 / chains + 0.05

    def question_start(self, prompt: np.ndarray) -> int:
        which = np.flatnonzero(prompt == self.ids["which"])
        return int(which[-1]) if len(which) else len(prompt)

    def longest_needles(self) -> int:
        per_chain = (2 + self.max_digits + 1) + self.hops * 4  # x = <n> .  then  x = y . per hop
        question = 3 + self.max_digits + 1
        return self.chains * per_chain + question + self.hops + 2

    def needles_and_question(self, rng: np.random.Generator, condition: dict) -> tuple:
        names = rng.choice(self.var_ids, self.chains * (self.hops + 1), replace=False)
        names = names.reshape(self.chains, self.hops + 1).tolist()
        values: list[list[int]] = []
        while len(values) < self.chains:
            values.append(self.number(rng, avoid=frozenset(tuple(v) for v in values)))
        eq, stop = self.ids["="], self.full_stop
        needles, depths = [], []
        for chain, value in zip(names, values, strict=True):
            links = [[chain[0], eq, *value, stop]]
            links += [[chain[h + 1], eq, chain[h], stop] for h in range(self.hops)]
            # the links of a chain in order: sorted depths
            needles += links
            depths += sorted(float(d) for d in rng.random(len(links)))
        asked = int(rng.integers(self.chains))
        question = [*self.encode("which variables are"), *values[asked], self.ids["?"]]
        return needles, depths, question, [*names[asked], stop]

    def assignments(self, prompt: np.ndarray) -> list[tuple[int, object]]:
        """(variable, number or variable) of every assignment in the haystack, in order."""
        found, end = [], self.question_start(prompt)
        for i in np.flatnonzero(prompt[:end] == self.ids["="]):
            if i == 0 or prompt[i - 1] not in self.var_set:
                continue
            if prompt[i + 1] in self.var_set:
                found.append((int(prompt[i - 1]), int(prompt[i + 1])))
            else:
                number = numbers_in(prompt[i + 1 :], self.digit_set)
                found.append((int(prompt[i - 1]), tuple(number[0].tolist()) if number else ()))
        return found

    def chains_of(self, prompt: np.ndarray) -> list[list[int]]:
        """The chains in the haystack, each as its variables in order of assignment."""
        chains: list[list[int]] = []
        for var, source in self.assignments(prompt):
            home = next((c for c in chains if isinstance(source, int) and source in c), None)
            if home is None:
                chains.append([var])
            else:
                home.append(var)
        return chains

    def solve(self, prompt: np.ndarray) -> np.ndarray:
        """The variables of the chain that starts from the asked number."""
        start = self.question_start(prompt) + 3
        asked = tuple(numbers_in(prompt[start:], self.digit_set)[0].tolist())
        firsts = {v: n for v, n in self.assignments(prompt) if not isinstance(n, int)}
        for chain in self.chains_of(prompt):
            if firsts.get(chain[0]) == asked:
                return np.asarray([*chain, self.full_stop], dtype=np.int64)
        return np.asarray([self.full_stop], dtype=np.int64)

    def answer_symbols(self) -> list[int]:
        return self.var_ids.tolist()

    def chance(self, example) -> tuple[float, float]:  # noqa: ANN001 - an Example
        per = 1 / len(self.var_ids)
        variables = int(example.answer.sum()) - 1
        return per**variables, (per * variables + 1) / (variables + 1)

    def prompt_shortcuts(self) -> dict:
        def chain_at(index: int):  # noqa: ANN202 - a predictor: one chain's variables
            def predict(prompt: np.ndarray, size: int) -> np.ndarray:
                chains = self.chains_of(prompt)
                return np.asarray([*(chains[index] if chains else []), self.full_stop])

            return predict

        def every_variable(prompt: np.ndarray, size: int) -> np.ndarray:
            seen = [v for v, _ in self.assignments(prompt)]
            return np.asarray([*seen, self.full_stop])

        return {
            "the first chain": chain_at(0),
            "the last chain": chain_at(-1),
            "every variable in order": every_variable,
            "the tokens before the question": self.tokens_before_question,
        }
