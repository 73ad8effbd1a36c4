"""The haystack the needle tasks share (RULER, Hsieh et al. 2024): filler sentences that hold
numbers of the same lengths as the answers, needles placed at chosen depths, a question, and the
answer at the end.

    the room is 3 9 . the sky is blue . the pass key is 4 7 1 . we had 8 0 2 . here we go .
    there are 5 5 apples . what is the pass key ? 4 7 1 .

Why the filler holds numbers: with digits only in the needle, "copy the digits before the
question" or "copy every digit seen" solves the task at any length (the old `passkey` task; a
CoPE model found it). Here one or two number sentences always open the haystack and one or two
end it, right before the question, so the first, the last and the most recent number are never
the key, and its index among the numbers is not fixed even at depth 0 or 1. Every number of an
example has the same length, drawn per example (`min_digits`..`max_digits`): keys vary in
length, but within an example length tells nothing (a review found that framing numbers of the
answer's length, an earlier design, let "the number of the framing length" score 0.55).

At small L a haystack holds only a handful of numbers, so guessing by index among them (the
second number, the third from last, ...) scores well above 0.1^digits: those guesses are stated
shortcuts, and `shortcut_margin` is the stated bound they stay under; the tables' best-shortcut
row reports the best of them on the examples a model answered.

The shortcut predictors (`Task.shortcuts`) read the prompt the model reads and guess from its
numbers; a test asserts each scores at most `shortcut_margin` on evaluation examples.
"""

from __future__ import annotations

import numpy as np

from poslab.checks import integer, list_of, number, require
from poslab.errors import ConfigError
from poslab.tasks.base import Example, Task, reads_prompt

DIGITS = [str(d) for d in range(10)]
# filler sentences; "#" is a number of min_digits..max_digits digits
SENTENCES = (
    "the room is # .",
    "there are # apples .",
    "we had # cups .",
    "the year was # .",
    "the grass is green .",
    "the sky is blue .",
    "here we go .",
    "there and back again .",
)
NUMBER_SENTENCES = tuple(s for s in SENTENCES if "#" in s)


def numbers_in(tokens: np.ndarray, digit_ids: set[int]) -> list[np.ndarray]:
    """The maximal runs of digit tokens in `tokens`, in order."""
    runs, start = [], None
    for i, t in enumerate([*tokens.tolist(), -1]):
        if t in digit_ids and start is None:
            start = i
        elif t not in digit_ids and start is not None:
            runs.append(tokens[start:i])
            start = None
    return runs


class Haystack(Task):
    """Base of the needle tasks. A subclass builds its vocabulary with `words` (the base adds
    the digits and the filler), and implements `needles_and_question(rng, condition)`: the
    needle token lists, the depth of each (None: drawn), the question, and the answer."""

    def __init__(
        self,
        min_digits: int = 2,
        max_digits: int = 4,
        eval_depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0),
        words: tuple[str, ...] = (),
    ) -> None:
        super().__init__()
        require("data.task.min_digits", min_digits, integer(1))
        require("data.task.max_digits", max_digits, integer(1))
        if max_digits < min_digits:
            raise ConfigError(
                f"data.task.max_digits={max_digits} is below data.task.min_digits={min_digits}; "
                "raise max_digits"
            )
        require("data.task.eval_depths", eval_depths, list_of(number(ge=0, le=1)))
        self.min_digits, self.max_digits = min_digits, max_digits
        self.eval_depths = [float(d) for d in eval_depths]
        filler_words = {w for s in SENTENCES for w in s.split() if w != "#"}
        self.vocabulary(DIGITS, sorted(filler_words | {"?", ",", "="} | set(words) - set(DIGITS)))
        self.digit_ids = np.array([self.ids[d] for d in DIGITS])
        self.digit_set = set(self.digit_ids.tolist())
        self.full_stop = self.ids["."]
        self.sentences = [s.split() for s in SENTENCES]
        self.number_sentences = [s.split() for s in NUMBER_SENTENCES]
        self.plain_sentences = [self.encode(s) for s in SENTENCES if "#" not in s]
        self.example_digits = max_digits  # every number's length; drawn anew for each example

    # -- pieces ---------------------------------------------------------------------------------

    def number(
        self, rng: np.random.Generator, size: int | None = None, avoid: frozenset = frozenset()
    ) -> list[int]:
        """A random number of `size` digits (None: the example's number length), leading
        zeros allowed, never one of `avoid` (the answers: a distractor equal to the key would
        make "the most frequent number" right)."""
        n = self.example_digits if size is None else size
        while True:
            digits = self.digit_ids[rng.integers(0, 10, n)].tolist()
            if tuple(digits) not in avoid:
                return digits

    def sentence(
        self,
        rng: np.random.Generator,
        with_number: bool = False,
        size: int | None = None,
        avoid: frozenset = frozenset(),
    ) -> list[int]:
        pool = self.number_sentences if with_number else self.sentences
        words = pool[int(rng.integers(len(pool)))]
        out: list[int] = []
        for w in words:
            out += self.number(rng, size, avoid) if w == "#" else [self.ids[w]]
        return out

    def longest_sentence(self) -> int:
        return max(len(s) - 1 + self.max_digits for s in self.number_sentences)

    def needles_and_question(
        self, rng: np.random.Generator, condition: dict
    ) -> tuple[list[list[int]], list[float | None], list[int], list[int]]:
        """(needles, their depths (None: drawn uniformly), question, answer)."""
        raise NotImplementedError

    def longest_needles(self) -> int:
        """The most tokens the needles, the question and the answer take together."""
        raise NotImplementedError

    def min_length(self) -> int:
        # the needles, question and answer, and the two number sentences that frame them
        return self.longest_needles() + 2 * self.longest_sentence() - 1

    # -- an example -----------------------------------------------------------------------------

    def example(
        self,
        length: int,
        rng: np.random.Generator,
        condition: dict | None = None,
        train: bool = False,
    ) -> Example:
        self.check_length(length)
        full = length
        if train:  # a haystack of any size that fits, padded after the answer (as copy does):
            # short ones are easy to learn from, long ones teach the distances up to L
            length = int(rng.integers(self.min_length(), full + 1))
        condition = dict(condition or {})
        # one length for every number of the example: within it, length tells nothing
        self.example_digits = int(rng.integers(self.min_digits, self.max_digits + 1))
        needles, depths, question, answer = self.needles_and_question(rng, condition)
        values = numbers_in(np.asarray(answer), self.digit_set)
        avoid = frozenset(tuple(v.tolist()) for v in values)
        # the tokens left for the framing number sentences and the filler between them
        room = length + 1 - sum(map(len, needles)) - len(question) - len(answer)
        # the draws go frame, filler, then places: the order every seeded example depends on
        first, last, middle_size = self._frame(rng, room, avoid)
        middle, starts = self._filler(rng, middle_size, avoid)
        places = self._places(rng, depths, starts, middle_size)
        haystack: list[int] = list(first)
        cut = 0
        for place, needle in sorted(zip(places, needles, strict=True), key=lambda p: p[0]):
            haystack += middle[cut:place] + needle
            cut = place
        haystack += middle[cut:] + last + question + answer
        tokens = np.zeros(full + 1, dtype=np.int64)  # padding after the answer
        tokens[: length + 1] = haystack
        mask = np.zeros(full, dtype=bool)
        mask[length - len(answer) : length] = True
        return Example(tokens, mask, condition)

    def _frame(
        self, rng: np.random.Generator, room: int, avoid: frozenset
    ) -> tuple[list[int], list[int], int]:
        """The number sentences that open and close the haystack, and the filler size left of
        `room`: apart from `example` so that each stage of its random draws reads alone."""
        first = self.sentence(rng, True, avoid=avoid)
        last = self.sentence(rng, True, avoid=avoid)
        middle_size = room - len(first) - len(last)
        # a second number sentence on either side where it fits, half the time: the key's
        # index among the numbers is then not fixed at depth 0 or 1
        for side in ("first", "last"):
            extra = self.sentence(rng, True, avoid=avoid)
            if rng.random() < 0.5 and len(extra) <= middle_size:
                middle_size -= len(extra)
                first, last = (extra + first, last) if side == "first" else (first, last + extra)
        return first, last, middle_size

    def _filler(
        self, rng: np.random.Generator, middle_size: int, avoid: frozenset
    ) -> tuple[list[int], list[int]]:
        """`middle_size` tokens of filler sentences, and the sentence starts a needle may go
        to (`middle_size` itself included: depth 1 is the end)."""
        middle, starts = [], [0]
        while len(middle) < middle_size:
            sentence = self.sentence(rng, bool(rng.random() < 0.5), avoid=avoid)
            if len(middle) + len(sentence) > middle_size:  # the last one is cut short: never
                # a number, which would be shorter than the others
                sentence = self.plain_sentences[int(rng.integers(len(self.plain_sentences)))]
            middle += sentence
            starts.append(len(middle))
        middle = middle[:middle_size]
        starts = sorted({s for s in starts if s < middle_size} | {middle_size})
        return middle, starts

    def _places(
        self,
        rng: np.random.Generator,
        depths: list[float | None],
        starts: list[int],
        middle_size: int,
    ) -> list[int]:
        """Where each needle goes: the sentence start nearest its depth of the middle (a
        depth of None is drawn here, one draw per needle in order)."""
        places = []
        for depth in depths:
            depth = float(rng.random()) if depth is None else depth
            places.append(min(starts, key=lambda s, d=depth: abs(s - d * middle_size)))
        return places

    def answer_symbols(self) -> list[int]:
        return self.digit_ids.tolist()

    def chance(self, example: Example) -> tuple[float, float]:
        """A uniform guess over digits (and the answer's separators, known)."""
        answer = example.targets[example.answer]
        digits = int(np.isin(answer, self.digit_ids).sum())
        return 0.1**digits, 0.1 * digits / len(answer) + (len(answer) - digits) / len(answer)

    # -- shortcuts --------------------------------------------------------------------------------

    def context_numbers(self, prompt: np.ndarray) -> list[np.ndarray]:
        """The numbers of the haystack (before the question)."""
        return numbers_in(prompt[: self.question_start(prompt)], self.digit_set)

    def question_start(self, prompt: np.ndarray) -> int:
        """Where the question begins in a prompt (the last "what")."""
        what = np.flatnonzero(prompt == self.ids["what"])
        return int(what[-1]) if len(what) else len(prompt)

    def shortcuts(self) -> dict:
        return {name: reads_prompt(guess) for name, guess in self.prompt_shortcuts().items()}

    def prompt_shortcuts(self) -> dict:
        """name -> guess(prompt, answer token count) of the task's trivial heuristics."""
        return self.number_shortcuts()

    def number_shortcuts(self) -> dict:
        """The heuristics over the haystack's numbers every needle task must defeat."""

        def pick(choose):  # noqa: ANN001, ANN202 - a predictor from a choice among numbers
            def predict(prompt: np.ndarray, size: int) -> np.ndarray:
                found = self.context_numbers(prompt)
                return self.answer_of([choose(found)] if found else [])

            return predict

        def most_frequent(found: list[np.ndarray]) -> np.ndarray:
            counts: dict[tuple, int] = {}
            for n in found:
                counts[tuple(n.tolist())] = counts.get(tuple(n.tolist()), 0) + 1
            return np.array(max(counts, key=counts.get))

        return {
            "the last number": pick(lambda f: f[-1]),
            "the first number": pick(lambda f: f[0]),
            "the most frequent number": pick(most_frequent),
            "the longest number": pick(lambda f: max(f, key=len)),
            "the second number": pick(lambda f: f[min(1, len(f) - 1)]),
            "the third number": pick(lambda f: f[min(2, len(f) - 1)]),
            "the second number from the end": pick(lambda f: f[max(-2, -len(f))]),
            "the third number from the end": pick(lambda f: f[max(-3, -len(f))]),
            "the tokens before the question": self.tokens_before_question,
        }

    def tokens_before_question(self, prompt: np.ndarray, size: int) -> np.ndarray:
        """The `size` tokens right before the question (what solved the old passkey)."""
        start = self.question_start(prompt)
        return prompt[max(0, start - size) : start]

    def answer_of(self, numbers: list) -> np.ndarray:
        """The answer tokens of a list of numbers: "n1 , n2 , ... ." (one: "n .")."""
        out: list[int] = []
        for i, n in enumerate(numbers):
            out += ([self.ids[","]] if i else []) + list(n)
        return np.asarray([*out, self.full_stop], dtype=np.int64)
