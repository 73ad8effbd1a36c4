"""The task interface: a generated sequence, the positions of its answer, and its score.

A task makes examples of exactly `length + 1` tokens (the model reads tokens[:-1] and predicts
tokens[1:], as for text windows); `answer` marks the targets that are the answer. Examples are a
pure function of (length, condition, rng), so a seed fixes a data set. The score of an example is
the exact match of its answer tokens under the model's argmax at each answer position (teacher
forcing): every argmax right ⇔ greedy decoding writes the whole answer, so one forward pass
scores it.

A task adds itself as one module under poslab/tasks/ and one file under conf/data/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from poslab.errors import ConfigError

PAD = "<pad>"


@dataclass(frozen=True)
class Example:
    tokens: np.ndarray  # (length + 1,) int64
    answer: np.ndarray  # (length,) bool over the targets tokens[1:]
    condition: dict[str, Any] = field(default_factory=dict)  # e.g. {"depth": 0.5}
    positions: np.ndarray | None = None  # (length + 1, A) of a task with position axes

    @property
    def targets(self) -> np.ndarray:
        return self.tokens[1:]

    @property
    def prompt(self) -> np.ndarray:
        """The tokens before the first answer token: what a model has read when it answers."""
        first = int(np.flatnonzero(self.answer)[0])
        return self.tokens[: first + 1]

    @property
    def answer_tokens(self) -> np.ndarray:
        return self.targets[self.answer]

    @property
    def padding(self) -> np.ndarray:
        """(length,) bool: targets that are padding (never scored, not even with loss_on=all)."""
        return self.targets == 0


# a trivial heuristic: an example -> the answer tokens it guesses, reading only what the model
# reads before each answer token (the prompt; a teacher-forced answer's earlier tokens)
Predictor = Callable[["Example"], np.ndarray]


def reads_prompt(guess: Callable[[np.ndarray, int], np.ndarray]) -> Predictor:
    """A predictor from a guess made on the prompt alone: (prompt, answer token count) -> ids."""
    return lambda example: guess(example.prompt, int(example.answer.sum()))


class Task:
    """Base class. Subclasses set `name`, build their vocabulary with `vocabulary(...)` (id 0 is
    the padding token) and implement `example`; `conditions` is the grid an evaluation covers
    (passkey: depths), `answer_symbols` the alphabet answers are drawn from (for chance).

    Every task states the trivial heuristics a model could learn instead of the task
    (`shortcuts`: name -> predictor reading only the prompt) and `solve`s its prompts (the oracle:
    proof that the prompt determines the answer). A test asserts that the oracle scores 1 and
    each shortcut at most `shortcut_margin` (exact match) on evaluation examples, unless the task
    is `shortcut_prone` (kept for comparison with published tables, documented as such); the
    task tables print the best shortcut as a baseline row beside chance."""

    name = "task"
    shortcut_margin = 0.05
    shortcut_prone = False
    # 0: positions are the token index (text); A: the task gives every token A positions (a
    # grid: row, column), which a multi-axis scheme reads and a 1-D scheme leaves for the index
    position_axes = 0

    def __init__(self) -> None:
        self.tokens: list[str] = [PAD]
        self.ids: dict[str, int] = {PAD: 0}

    def vocabulary(self, *groups: list[str]) -> None:
        """Add token groups (names must be unique) after the padding token."""
        for token in (t for group in groups for t in group):
            if token in self.ids:
                raise ValueError(f"{self.name}: token {token!r} appears twice in the vocabulary")
            self.ids[token] = len(self.tokens)
            self.tokens.append(token)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, words: str | list[str]) -> list[int]:
        """Ids of a list of tokens, or of a string of space-separated tokens."""
        return [self.ids[w] for w in (words.split() if isinstance(words, str) else words)]

    def decode(self, ids: Any) -> str:
        return " ".join(self.tokens[int(i)] for i in ids)

    def min_length(self) -> int:
        """The shortest `length` an example fits in."""
        raise NotImplementedError

    def check_length(self, length: int, key: str = "data.seq_len") -> None:
        if length < self.min_length():
            raise ConfigError(
                f"{key}={length} is too short for the {self.name} task: an example needs at "
                f"least {self.min_length()} tokens; raise {key} or shorten the task's options"
            )

    def example(
        self,
        length: int,
        rng: np.random.Generator,
        condition: dict | None = None,
        train: bool = False,
    ) -> Example:
        """One example of `length` + 1 tokens. `train` examples may vary within the length
        (copy: any size up to it); evaluation examples fill it."""
        raise NotImplementedError

    def max_position(self, length: int) -> int:
        """The largest position an example of `length` tokens uses (on any axis)."""
        return length - 1

    def conditions(self) -> list[dict[str, Any]]:
        """The conditions every evaluation length is measured under (one heatmap axis)."""
        return [{}]

    def answer_symbols(self) -> list[int]:
        """The ids answers are drawn from uniformly (chance = 1 / their number per token)."""
        raise NotImplementedError

    def chance(self, example: Example) -> tuple[float, float]:
        """(exact-match, per-token) accuracy of a uniform guess over the answer symbols."""
        per_token = 1.0 / len(self.answer_symbols())
        return per_token ** int(example.answer.sum()), per_token

    def shortcuts(self) -> dict[str, Predictor]:
        """The trivial heuristics that could pass for the task (name -> predictor)."""
        return {}

    def solve(self, prompt: np.ndarray) -> np.ndarray:
        """The answer tokens, read off the prompt by the rule the task states."""
        raise NotImplementedError

    def oracle(self, example: Example) -> np.ndarray:
        """The answer by the task's rule from what a model reads (the prompt; a teacher-forced
        answer's earlier tokens): proof that the input determines the answer."""
        return self.solve(example.prompt)


def predictor_accuracy(examples: list[Example], predict: Predictor) -> tuple[float, float]:
    """(exact-match, token) accuracy of a predictor over examples; a guess of the wrong length
    is wrong at every token past the shorter of the two."""
    exact = right = total = 0
    for example in examples:
        truth = example.answer_tokens
        guess = np.asarray(predict(example))
        n = min(len(guess), len(truth))
        hits = int((guess[:n] == truth[:n]).sum())
        exact += len(guess) == len(truth) and hits == len(truth)
        right += hits
        total += len(truth)
    return exact / max(len(examples), 1), right / max(total, 1)


def best_shortcut(task: Task, examples: list[Example]) -> dict[str, Any] | None:
    """The shortcut with the highest exact-match accuracy on `examples` (ties: token accuracy):
    {"name", "accuracy", "token_accuracy"}; None for a task that states none."""
    scored = [
        (predictor_accuracy(examples, predict), name) for name, predict in task.shortcuts().items()
    ]
    if not scored:
        return None
    (exact, token), name = max(scored, key=lambda s: s[0])
    return {"name": name, "accuracy": exact, "token_accuracy": token}


def score(example: Example, predicted: np.ndarray) -> tuple[bool, int, int]:
    """(answer exactly right, answer tokens right, answer tokens) for argmax ids over the
    targets (length,)."""
    right = predicted[example.answer] == example.targets[example.answer]
    return bool(right.all()), int(right.sum()), int(right.size)


def example_rng(seed: int, *stream: int) -> np.random.Generator:
    """The generator of one example: a pure function of the run's seed and the example's place
    (split, length, condition, index), so any example can be made again alone."""
    return np.random.default_rng([seed, *stream])
