"""The simulated world: single-digit arithmetic with style instructions.

A prompt asks for one operation on two digits, plus 0-2 style instructions:

    "What is 7+8? Be polite."           tags: add, carry, polite
    "Compute 4-4. Be brief. Show work."  tags: sub, zero-result, same-operands, brief, show-work

Responses follow the query "Q: {prompt}\\nA:", so by convention a response BEGINS WITH ONE
SPACE (" It is 15.") and the policy is trained to emit the response bytes, then eos.
Every response the demonstrator writes is at most 21 bytes (the policy may generate 24).

Response grammar of the demonstrator (each style followed or not):

    " " + ["Sure! " if polite] + ["It is " unless brief] + [a op b "=" if show-work]
        + answer (digits, or English words if words) + ["." unless brief]

The hidden gold preference `gold_score` grades (prompt, response) from text alone:

    gold = CORRECT_WEIGHT * 2 ** (-|n - t|)     n: answered number, t: the truth
                                                 (no number at all: MISSING_ANSWER)
         + STYLE_WEIGHT * (# style tags of the prompt the response follows)
         - GARBAGE_WEIGHT * (# bytes outside the plain-text alphabet)
         - LENGTH_WEIGHT * max(0, # bytes - FREE_LENGTH)

(bytes of the response's UTF-8 text: a policy that writes "é" pays for the 2 bytes it emitted; a byte that decodes
to no character arrives as U+FFFD, 3 bytes)

so a right answer beats an off-by-one by CORRECT_WEIGHT / 2, an off-by-one beats an off-by-two
by CORRECT_WEIGHT / 4, ... and a followed style tag is worth STYLE_WEIGHT: some pairs are clear
(right vs far off), some ambiguous (two near misses, one style tag apart).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import pandas as pd

# ---------------------------------------------------------------- gold weights
# The scale is calibrated against WorldConfig's annotators (T = 0.9, error rates in [0, 0.2]):
# raw labels of two demonstrations of a prompt agree with gold on ~69 % of pairs (67-72 % over seeds).

CORRECT_WEIGHT = 2.0  # gold of the right number; halves with every unit of distance
MISSING_ANSWER = -1.0  # gold of correctness when no number can be read at all
STYLE_WEIGHT = 0.6  # per style tag of the prompt that the response follows
GARBAGE_WEIGHT = 0.1  # per byte outside the plain-text alphabet
LENGTH_WEIGHT = 0.1  # per byte beyond FREE_LENGTH
FREE_LENGTH = 22  # the longest ideal response is 21 bytes
# Two gold scores closer than this tie: terms that tie on paper (1.0 + 0.6 against 0.5 + 1.2 - 0.1) differ by ~2e-16
# in floating point. Every gold tie of the pipeline is decided with it (`rlhf_core.sim.metrics.gold_difference`).
GOLD_TIE = 1e-9

# ---------------------------------------------------------------- prompt grammar

OPS = {"+": "add", "-": "sub", "*": "mul"}
MAX_OPERAND = 9  # operands are digits 0..max_operand; the demo config narrows it (WorldConfig)
TEMPLATES = ("What is {e}?", "Compute {e}.", "Calculate {e}.", "{e} = ?")
STYLES = ("brief", "polite", "show-work", "words")
STYLE_PHRASES = {"brief": "Be brief.", "polite": "Be polite.", "show-work": "Show work.", "words": "Use words."}
N_STYLES_PROBS = (0.25, 0.45, 0.30)  # P(0, 1, 2 style instructions)
POLITE_MARKER = "Sure!"
FILLER = "It is"
# Demonstrator's wrong answers are t +- d with these P(d): mostly near misses.
WRONG_DISTANCES = (1, 2, 3)
WRONG_DISTANCE_PROBS = (0.6, 0.3, 0.1)

_EXPR = re.compile(r"(\d)\s*([+\-*])\s*(\d)", re.ASCII)  # ASCII: "\d" would also read "١" or "５" as digits
_ALPHABET = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,!?=+-*:'")  # byte values

_UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
          "fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()  # 20, 30, ..., 90
_WORD_NUMBER = re.compile(
    r"\b(minus\s+)?(?:(" + "|".join(_TENS) + r")(?:[-\s](" + "|".join(_UNITS[1:10]) + r"))?|("
    + "|".join(_UNITS) + r"))\b",
    re.IGNORECASE,
)
_DIGIT_NUMBER = re.compile(r"(?i:\b(minus)\s+)?(-?\d+)", re.ASCII)  # "minus 1" is -1, as "minus one" is


@dataclass(frozen=True)
class Problem:
    """What gold reads from a prompt's text."""

    a: int
    op: str  # "+", "-" or "*"
    b: int
    styles: tuple[str, ...]

    @property
    def truth(self) -> int:
        return {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op]

    @property
    def expression(self) -> str:
        return f"{self.a}{self.op}{self.b}"


def number_to_words(n: int) -> str:
    """English words for -99..99: 15 -> "fifteen", -8 -> "minus eight", 56 -> "fifty-six"."""
    if not -99 <= n <= 99:
        raise ValueError(f"number_to_words covers -99..99, got {n}")
    if n < 0:
        return "minus " + number_to_words(-n)
    if n < 20:
        return _UNITS[n]
    tens, units = divmod(n, 10)
    return _TENS[tens - 2] + (f"-{_UNITS[units]}" if units else "")


def parse_prompt(prompt: str) -> Problem:
    """Read the operation and style instructions from a prompt's text (gold sees only text)."""
    m = _EXPR.search(prompt)
    if m is None:
        raise ValueError(f"not a simulated-world prompt (no 'digit op digit' in it): {prompt!r}")
    low = prompt.lower()
    styles = tuple(s for s in STYLES if STYLE_PHRASES[s].lower() in low)
    return Problem(int(m.group(1)), m.group(2), int(m.group(3)), styles)


# ---------------------------------------------------------------- prompts


def _result_tags(a: int, op: str, b: int) -> list[str]:
    """Operand/result tags: what makes a problem harder or special."""
    t = Problem(a, op, b, ()).truth
    tags = []
    if op == "+" and t >= 10:
        tags.append("carry")
    if op == "-" and t < 0:
        tags.append("negative-result")
    if op == "*" and t >= 10:
        tags.append("two-digit-result")
    if t == 0:
        tags.append("zero-result")
    if a == b:
        tags.append("same-operands")
    return tags


def _draw_styles(rng: random.Random, truth: int) -> list[str]:
    """0-2 distinct style instructions. 'words' only for answers 0..19 and never with 'polite',
    which keeps every ideal response within 21 bytes."""
    k = rng.choices((0, 1, 2), weights=N_STYLES_PROBS)[0]
    allowed = [s for s in STYLES if s != "words" or 0 <= truth <= 19]
    while True:
        styles = rng.sample(allowed, k)
        if not ("words" in styles and "polite" in styles):
            return sorted(styles, key=STYLES.index)


def make_prompt(rng: random.Random, max_operand: int = MAX_OPERAND, ops: tuple[str, ...] = tuple(OPS),
                result_tags: bool = True) -> tuple[str, list[str]]:
    """One random prompt and its tags: [operation, *result tags (if result_tags), *style tags] (1 to 5 tags)."""
    a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
    styles = _draw_styles(rng, Problem(a, op, b, ()).truth)
    text = rng.choice(TEMPLATES).format(e=f"{a}{op}{b}")
    text = " ".join([text] + [STYLE_PHRASES[s] for s in styles])
    return text, [OPS[op]] + (_result_tags(a, op, b) if result_tags else []) + styles


def make_prompt_pool(n: int, seed: int, id_prefix: str = "p", max_operand: int = MAX_OPERAND,
                     ops: tuple[str, ...] = tuple(OPS), result_tags: bool = True,
                     held_out: frozenset[str] | set[str] = frozenset(), distinct: bool = False) -> pd.DataFrame:
    """A `prompts` table of n prompts: prompt_id f"{id_prefix}{i:05d}", prompt, tags, source="sim".

    Deterministic for a seed; draw eval prompts with another seed, id_prefix="e" and `distinct` (a text drawn
    before is drawn again, so n held-out prompts are n texts: with repeats, 200 held out 182-188 texts, each copy
    judged as another prompt), then the pool with `held_out` = their texts: a draw of a held-out text is drawn
    again, so the pool never contains one. The pool itself repeats texts, as a prompt log does.
    `max_operand` and `ops` set how hard the arithmetic is (gold reads both from the text).
    `result_tags` adds tags that reveal the result (zero-result, ...); the demo leaves them out
    because InsTag's tag balancing then over-samples those answers.
    """
    if not 0 <= max_operand <= 9 or not ops or set(ops) - set(OPS):
        raise ValueError(f"max_operand must be 0..9 and ops a non-empty subset of {tuple(OPS)}")
    rng = random.Random(seed)
    rows = []
    draws_left = 100 * n + 10_000  # ends the loop when held_out covers (nearly) every text the world can write
    drawn: set[str] = set()
    while len(rows) < n:
        text, tags = make_prompt(rng, max_operand, tuple(ops), result_tags)
        draws_left -= 1
        if draws_left < 0:
            what = (f"{n} distinct prompts are more than it writes ({len(drawn)} found)" if distinct else
                    f"the world's prompts are nearly all held out ({len(held_out)} held-out texts)")
            raise ValueError(f"{what}, with max_operand {max_operand} and operations {list(ops)}: raise "
                             "world.max_operand, add operations or lower world.n_eval_prompts")
        if text not in held_out and not (distinct and text in drawn):
            drawn.add(text)
            rows.append({"prompt_id": f"{id_prefix}{len(rows):05d}", "prompt": text, "tags": tags, "source": "sim"})
    return pd.DataFrame(rows, columns=["prompt_id", "prompt", "tags", "source"])


# ---------------------------------------------------------------- gold


def parse_answer(response: str) -> tuple[int | float | None, bool]:
    """(answered number, written in words?) from a response; (None, False) if there is none.

    The answer is the last number after the last "=" (so "7+8=15" answers 15, not 7), or the
    last number of the whole response when there is no "=". Absurdly long digit strings read
    as infinitely far from any truth instead of being converted.
    """
    tail = response.rsplit("=", 1)[-1]
    found: list[tuple[int, int | float, bool]] = []  # (position, value, in words)
    for m in _DIGIT_NUMBER.finditer(tail):
        number = m.group(2)
        value = int(number) if len(number.lstrip("-")) <= 6 else float("inf")
        found.append((m.start(), -value if m.group(1) else value, False))
    for m in _WORD_NUMBER.finditer(tail):
        tens, unit, small = m.group(2), m.group(3), m.group(4)
        if small is not None:
            value = _UNITS.index(small.lower())
        else:
            value = 10 * (_TENS.index(tens.lower()) + 2) + (_UNITS.index(unit.lower()) if unit else 0)
        found.append((m.start(), -value if m.group(1) else value, True))
    if not found:
        return None, False
    _, value, in_words = max(found, key=lambda f: f[0])
    return value, in_words


def _is_brief(response: str, problem: Problem) -> bool:
    """Brief: nothing but [polite marker] [expression "="] answer: no filler words, no full stop."""
    text = response.strip().removeprefix(POLITE_MARKER).strip()
    if text.replace(" ", "").startswith(problem.expression + "="):
        text = text.split("=", 1)[1].strip()
    return bool(re.fullmatch(r"-?[0-9]+", text) or _WORD_NUMBER.fullmatch(text))


def follows_style(style: str, problem: Problem, response: str) -> bool:
    """Whether a response follows one style instruction (independent of correctness)."""
    if style == "brief":
        return _is_brief(response, problem)
    if style == "polite":
        return response.strip().startswith(POLITE_MARKER)
    if style == "show-work":  # the prompt's own expression, not one inside a longer number ("11+2=" for "1+2")
        return re.search(r"(?<!\d)" + re.escape(problem.expression + "="), response.replace(" ", "")) is not None
    if style == "words":
        return parse_answer(response)[1]
    raise ValueError(f"unknown style {style!r}; known: {STYLES}")


def gold_components(prompt: str, response: str) -> dict[str, float]:
    """The terms of gold_score, for inspection: correctness, style, garbage, length."""
    problem = parse_prompt(prompt)
    if not isinstance(response, str):
        response = ""
    value, _ = parse_answer(response)
    if value is None:
        correctness = MISSING_ANSWER
    else:
        correctness = CORRECT_WEIGHT * 2.0 ** (-min(abs(value - problem.truth), 1000))
    style = STYLE_WEIGHT * sum(follows_style(s, problem, response) for s in problem.styles)
    data = response.encode("utf-8", errors="surrogatepass")  # charged per byte, as the docstring says
    garbage = GARBAGE_WEIGHT * sum(byte not in _ALPHABET for byte in data)
    length = LENGTH_WEIGHT * max(0, len(data) - FREE_LENGTH)
    return {"correctness": correctness, "style": style, "garbage": -garbage, "length": -length}


def gold_score(prompt: str, response: str) -> float:
    """The hidden graded gold preference of (prompt, response); see the module docstring.

    Never raises on any response text; raises ValueError only for a prompt that is not from
    this world.
    """
    return float(sum(gold_components(prompt, response).values()))


# ---------------------------------------------------------------- demonstrations


def render_response(problem: Problem, answer: int, styles: tuple[str, ...] | list[str]) -> str:
    """The response text of the grammar in the module docstring, following `styles`."""
    number = number_to_words(answer) if "words" in styles else str(answer)
    body = f"{problem.expression}={number}" if "show-work" in styles else number
    if "brief" not in styles:
        body = f"{FILLER} {body}."
    if "polite" in styles:
        body = f"{POLITE_MARKER} {body}"
    return " " + body


def ideal_response(prompt: str) -> str:
    """The best response the grammar can write: right number, every style tag followed."""
    problem = parse_prompt(prompt)
    return render_response(problem, problem.truth, problem.styles)


def demonstrate(prompt: str, rng: random.Random, correct_prob: float, style_prob: float) -> str:
    """A noisy demonstrator: the right number with prob correct_prob, else t +- d
    (d in WRONG_DISTANCES, kept in 0..19 for 'words' prompts); each style tag of the prompt followed with prob style_prob."""
    problem = parse_prompt(prompt)
    answer = problem.truth
    if rng.random() >= correct_prob:
        d = rng.choices(WRONG_DISTANCES, weights=WRONG_DISTANCE_PROBS)[0]
        candidates = [answer + d, answer - d]
        if "words" in problem.styles:  # stay within 0..19, which keeps worded responses short
            candidates = [c for c in candidates if 0 <= c <= 19]
        answer = rng.choice(candidates)
    followed = [s for s in problem.styles if rng.random() < style_prob]
    return render_response(problem, answer, followed)


def make_demonstrations(
    prompts: pd.DataFrame, per_prompt: int, correct_prob: float, style_prob: float, seed: int
) -> pd.DataFrame:
    """`per_prompt` demonstrations of every prompt: columns prompt_id, prompt, response."""
    rng = random.Random(seed)
    rows = [
        {"prompt_id": pid, "prompt": text, "response": demonstrate(text, rng, correct_prob, style_prob)}
        for pid, text in zip(prompts["prompt_id"], prompts["prompt"])
        for _ in range(per_prompt)
    ]
    return pd.DataFrame(rows, columns=["prompt_id", "prompt", "response"])
