"""A ~60 KB mixed text for the SPM tokenizer's byte-exactness test and benchmark (a seed makes it; nothing stored).

English-like prose from a fixed word list, with digits and numbers, accented Latin, Greek, Cyrillic, CJK, emoji,
runs of spaces / tabs / newlines, code, special-token texts (``<start_of_turn>``, ``<unused5>``: cut out with
parse_special), and characters outside Gemma-3's vocabulary (private use, rare CJK extension B, math letters: byte
fallback). ``random.Random`` with a fixed seed gives the same text on every CPython 3.
"""
from __future__ import annotations

import random

SEED = 23
TARGET_BYTES = 60_000

_WORDS = ("the of and to in is was that for it with as his on be at by had are but from or have an they which one "
          "you were her all she there would their we him been has when who will more no if out so said what up its "
          "about into than them can only other new some could time these two may then do first any my now such like "
          "our over man me even most made after also did many before must through back years where much your way "
          "well down should because each just those people tensor graph ggml llama tokenizer vocabulary merge score "
          "quantization matrix multiplication attention layer embedding sentencepiece byte fallback").split()
_FOREIGN = ("Zürich café naïve façade Øresund Ærø straße señor élève coöperate Łódź Ελληνικά αλφάβητο русский язык "
            "Україна 数学是科学的语言 日本語のテキスト ひらがな カタカナ 한국어 문장 עברית العربية हिन्दी ภาษาไทย").split()
_EMOJI = ["🚀", "🔥", "🦙", "👍🏽", "🇫🇷", "❤️", "✨", "🤖"]
_ODD = ["\ue000", "\ue123", "\U00020b9f", "\U0002a6b2", "\U0001d54f", "\U0001f9ff\u200d", "\u2581", "\u00a0",
        "\u0301", "\ufeff", "\x07", "\x00"]
_SPECIAL = ["<start_of_turn>", "<end_of_turn>", "<unused5>", "<bos>", "<start_of_image>", "<b>", "</td>"]
_SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "    ", " \n", "\t\t", " " * 9, "\r\n"]
_CODE = ["def f(x):\n    return x**2  # square\n", "for (int i = 0; i < n; ++i) { y[i] += a * x[i]; }\n",
         "http://example.org/a?b=c&d=1", "ggml_mul_mat(ctx, a, b)", "x = [1, 2, 3]  # list\n"]


def spm_text(seed: int = SEED, target_bytes: int = TARGET_BYTES) -> str:
    """The text: sentences of 4..24 words joined by spaces or whitespace runs until ``target_bytes`` of UTF-8."""
    rng = random.Random(seed)
    out: list[str] = []
    n = 0
    while n < target_bytes:
        words = []
        for _ in range(rng.randint(4, 24)):
            r = rng.random()
            if r < 0.70:
                w = rng.choice(_WORDS)
                w = w.capitalize() if rng.random() < 0.1 else w
            elif r < 0.80:
                w = rng.choice(_FOREIGN)
            elif r < 0.87:
                w = str(rng.randint(0, 10 ** rng.randint(1, 9))) if rng.random() < 0.7 else f"{rng.random() * 100:.3f}"
            elif r < 0.90:
                w = rng.choice(_EMOJI)
            elif r < 0.93:
                w = rng.choice(_ODD) + rng.choice(_WORDS)
            elif r < 0.95:
                w = rng.choice(_SPECIAL)
            elif r < 0.97:
                w = rng.choice(_CODE)
            else:
                w = rng.choice(_WORDS) + rng.choice(",;:!?'\"()-")
            words.append(w)
            words.append(rng.choice(_SPACES) if rng.random() < 0.12 else " ")
        s = "".join(words).rstrip(" ") + rng.choice([". ", ".\n", "? ", "!\n\n", ". "])
        out.append(s)
        n += len(s.encode("utf-8"))
    return "".join(out)
