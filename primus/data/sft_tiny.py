"""A tiny, learnable instruction set (no hub): deterministic question -> answer pairs.

Every answer is a function of its question (sums of small numbers, the next weekday, a fixed
table of colours and capitals), so a model of a few hundred thousand parameters sees its
response loss fall within tens of steps. Written in both record shapes Primus reads:
``messages`` (chat template) and ``prompt``/``response``.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_COLOURS = {"banana": "yellow", "grass": "green", "sky": "blue", "snow": "white", "coal": "black",
            "tomato": "red", "orange": "orange", "plum": "purple"}
_CAPITALS = {"France": "Paris", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo", "Egypt": "Cairo",
             "Peru": "Lima", "Kenya": "Nairobi", "Norway": "Oslo"}
_NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def question_answer(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(5)
    if kind == 0:
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    if kind == 1:
        day = rng.randrange(7)
        return f"Which day comes after {_DAYS[day]}?", f"After {_DAYS[day]} comes {_DAYS[(day + 1) % 7]}."
    if kind == 2:
        thing = rng.choice(sorted(_COLOURS))
        return f"What colour is {thing}?", f"The colour of {thing} is {_COLOURS[thing]}."
    if kind == 3:
        country = rng.choice(sorted(_CAPITALS))
        return f"What is the capital of {country}?", f"The capital of {country} is {_CAPITALS[country]}."
    n = rng.randint(0, 9)
    return f"Write the number {n} in words.", f"The number {n} is written {_NUMBERS[n]}."


def tiny_instructions(n: int = 800, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    return [question_answer(rng) for _ in range(n)]


def sample_texts() -> list[str]:
    """Every word the set can produce (to train the tiny tokenizer on)."""
    return [f"{q} {a}" for q, a in tiny_instructions(2000, seed=1)]


def write_instruction_files(out_dir: Path, n: int = 800, seed: int = 0) -> dict[str, Path]:
    """``messages.jsonl`` and ``prompt_response.jsonl`` with the same pairs; reused when present."""
    from primus.data.tiny_assets import BUILD_WAIT_S
    from primus.runtime.locks import exclusive

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"messages": out_dir / "messages.jsonl", "prompt_response": out_dir / "prompt_response.jsonl"}
    if all(f.exists() for f in files.values()):
        return files
    with exclusive(out_dir / ".build.lock", what=f"the tiny instruction set {out_dir}", wait_s=BUILD_WAIT_S):
        if all(f.exists() for f in files.values()):  # another process built it while we waited
            return files
        pairs = tiny_instructions(n, seed)
        lines = {
            "messages": [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
                         for q, a in pairs],
            "prompt_response": [{"prompt": q, "response": a} for q, a in pairs],
        }
        for name, file in files.items():
            tmp = file.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in lines[name]), encoding="utf-8")
            tmp.replace(file)
    return files
