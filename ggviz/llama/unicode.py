"""unicode.cpp's part of the tokenizers -- mirrors llama.cpp's src/unicode.cpp for what ggviz's vocabularies use.

* GPT-2's byte <-> code point map (``unicode_byte_to_utf8_map``): ``byte_encode`` turns a word's UTF-8 bytes into
  printable code points (a space becomes ``Ġ``, a newline ``Ċ``).
* ``cpts_from_utf8`` (``unicode_cpts_from_utf8``, lenient) and ``UTF8_LEN`` (``unicode_len_utf8``).
* Code point classes (``unicode_cpt_flags``: letter ``\\p{L}``, number ``\\p{N}``, whitespace ``\\s``), from
  llama.cpp's own Unicode table (``_unicode_classes.py``, generated from its ``unicode-data.cpp``), not from
  Python's ``unicodedata``, whose Unicode version depends on the Python version.
* ``regex_split`` (``unicode_regex_split`` without the byte encoding): the pre-tokenizer's regex passes, ``\\p{N}``
  (``split_digits``) and GPT-2's regex, which llama.cpp runs with a hand-written matcher
  (``unicode_regex_split_custom_gpt2``) reproduced here step by step.
"""
from __future__ import annotations

import bisect

from . import _unicode_classes as uc

# unicode_len_utf8: a UTF-8 sequence's length from the high nibble of its first byte (a stray byte counts as 1)
UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)

# --------------------------------------------------------------------------------------------------------------
# byte <-> unicode mapping (unicode_byte_to_utf8_map): printable Latin-1 bytes map to themselves, the other 68
# bytes (controls, space, DEL, NBSP, soft hyphen, ...) to U+0100.. in byte order.
# --------------------------------------------------------------------------------------------------------------


def _build_byte_map() -> dict[int, str]:
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(0x100 + extra)
            extra += 1
    return mapping


BYTE_TO_UNICODE: dict[int, str] = _build_byte_map()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in BYTE_TO_UNICODE.items()}
_BYTE_TABLE = [BYTE_TO_UNICODE[b] for b in range(256)]


def byte_encode(word: str) -> str:
    """GPT-2 byte-level encoding of a word: its UTF-8 bytes as printable code points (``" a"`` -> ``"Ġa"``)."""
    return "".join([_BYTE_TABLE[b] for b in word.encode("utf-8", "surrogatepass")])


def cpts_from_utf8(data: bytes) -> str:
    """Decode UTF-8 the lenient way llama.cpp does (``unicode_cpts_from_utf8``): a byte that does not start a
    complete sequence becomes U+FFFD and decoding resumes at the next byte.  (A 4-byte sequence above U+10FFFF
    also becomes U+FFFD here; llama.cpp aborts on it.)"""
    out = []
    i, n = 0, len(data)
    while i < n:
        b0 = data[i]
        if b0 < 0x80:
            out.append(chr(b0))
            i += 1
            continue
        if b0 & 0x40 == 0:                   # stray continuation byte
            out.append("\ufffd")
            i += 1
            continue
        if b0 & 0x20 == 0:
            need, cp = 1, b0 & 0x1F
        elif b0 & 0x10 == 0:
            need, cp = 2, b0 & 0x0F
        elif b0 & 0x08 == 0:
            need, cp = 3, b0 & 0x07
        else:
            out.append("\ufffd")
            i += 1
            continue
        if i + need >= n:                    # truncated sequence
            out.append("\ufffd")
            i += 1
            continue
        ok = all(data[i + k] & 0xC0 == 0x80 for k in range(1, need + 1))
        if not ok:
            out.append("\ufffd")
            i += 1
            continue
        for k in range(1, need + 1):
            cp = (cp << 6) | (data[i + k] & 0x3F)
        out.append(chr(cp) if cp <= 0x10FFFF else "\ufffd")
        i += need + 1
    return "".join(out)


# --------------------------------------------------------------------------------------------------------------
# code point classes (unicode_cpt_flags: is_letter = \p{L}, is_number = \p{N}, is_whitespace = \s)
# --------------------------------------------------------------------------------------------------------------

LETTER, NUMBER, WS, OTHER = 1, 2, 4, 8


def _load_classes() -> tuple[list[int], list[int], frozenset[str]]:
    starts, classes = [], []
    for item in "".join(uc.RANGES).split(","):
        start, cls = item.split(":")
        starts.append(int(start, 16))
        classes.append(int(cls))
    return starts, classes, frozenset(map(chr, uc.WHITESPACE))


_RANGE_STARTS, _RANGE_CLASSES, _WHITESPACE = _load_classes()
_CLASS_CACHE: dict[str, int] = {}


def char_class(ch: str) -> int:
    """letter / number / whitespace / other, from llama.cpp's own Unicode table (see _unicode_classes.py)."""
    c = _CLASS_CACHE.get(ch)
    if c is None:
        if ch in _WHITESPACE:
            c = WS
        else:
            c = _RANGE_CLASSES[bisect.bisect_right(_RANGE_STARTS, ord(ch)) - 1]
        _CLASS_CACHE[ch] = c
    return c


for _i in range(128):
    char_class(chr(_i))


def split_digits(text: str) -> list[str]:
    """The ``\\p{N}`` regex pass: every number code point is a piece of its own; the text between stays whole."""
    pieces: list[str] = []
    start = 0
    for i, ch in enumerate(text):
        if char_class(ch) == NUMBER:
            if i > start:
                pieces.append(text[start:i])
            pieces.append(ch)
            start = i + 1
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def regex_split_custom_gpt2(piece: str) -> list[str]:
    """GPT-2's pre-tokenizer regex exactly as llama.cpp's ``unicode_regex_split_custom_gpt2`` matches it.

    Positions outside ``piece`` have no class (0): a match never extends past the piece it started in."""
    n = len(piece)
    if n == 0:
        return []
    cls = [char_class(ch) for ch in piece]
    cls.append(0)  # OUT_OF_RANGE sentinel
    words: list[str] = []
    pos = 0
    while pos < n:
        start = pos
        ch = piece[pos]
        # 's|'t|'re|'ve|'m|'ll|'d
        if ch == "'" and pos + 1 < n:
            c1 = piece[pos + 1]
            if c1 in "stmd":
                words.append(piece[pos:pos + 2])
                pos += 2
                continue
            if pos + 2 < n and c1 + piece[pos + 2] in ("re", "ve", "ll"):
                words.append(piece[pos:pos + 3])
                pos += 3
                continue
        f2 = cls[pos + 1] if ch == " " else cls[pos]
        if f2 == LETTER or f2 == NUMBER:          # <space>?\p{L}+  and  <space>?\p{N}+
            if ch == " ":
                pos += 1
            while cls[pos] == f2:
                pos += 1
            words.append(piece[start:pos])
            continue
        if f2 == OTHER:                             # <space>?[^\s\p{L}\p{N}]+
            if ch == " ":
                pos += 1
            while cls[pos] == OTHER:
                pos += 1
            words.append(piece[start:pos])
            continue
        n_ws = 0
        while cls[pos + n_ws] == WS:
            n_ws += 1
        if n_ws > 1 and pos + n_ws < n:              # \s+(?!\S): leave the last space for the next word
            pos += n_ws - 1
        elif n_ws > 0:                               # \s+
            pos += n_ws
        else:                                        # no match: one code point
            pos += 1
        words.append(piece[start:pos])
    return words


def regex_split(text: str, passes) -> list[str]:
    """``unicode_regex_split`` without the byte encoding: the raw words of one text fragment, each pass
    (``"digits"``: ``\\p{N}``, ``"gpt2"``: GPT-2's regex) splitting the pieces of the one before."""
    pieces = [text] if text else []
    for kind in passes:
        split = split_digits if kind == "digits" else regex_split_custom_gpt2
        pieces = [w for p in pieces for w in split(p)]
    return pieces
