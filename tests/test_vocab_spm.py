"""ggviz.llama.vocab's SPM tokenizer (llm_tokenizer_spm) against llama.cpp: the Gemma-3 reference strings, llama.cpp's
own SPM test vectors (llama-spm, phi-3: tests/data/llamacpp_vocab/), hand-checked cases on a tiny vocabulary, and a
differential test against the installed llama_cpp (AVX2 build) on a few hundred random strings with Gemma-3's
262,144-token vocabulary. The Gemma tests skip when the model is absent (`ggviz fetch gemma3-270m` fetches it)."""
from __future__ import annotations

import json
import pathlib
import random

import numpy as np
import pytest

from ggviz import fetch
from ggviz.ggml import gguf as gguf_file
from ggviz.llama.vocab import LLAMA_VOCAB_TYPE_SPM, TokenAttr, TokenType, Vocab
from tests.llamacpp_vocab import LlamaCppUnavailable, LlamaCppVocab

DATA = pathlib.Path(__file__).parent / "data"
VECTORS = DATA / "llamacpp_vocab"


def gemma_path() -> pathlib.Path:
    return fetch.models_dir() / fetch.MODELS["gemma3-270m"].filename


@pytest.fixture(scope="module")
def gemma() -> Vocab:
    path = gemma_path()
    if not path.is_file():
        pytest.skip(f"the Gemma-3 model is absent ({path}): `ggviz fetch gemma3-270m` fetches it")
    return Vocab.from_gguf_kv(gguf_file.load_gguf(path).kv)


def _llamacpp(path):
    """llama.cpp's tokenizer for ``path`` in a child process (see tests/llamacpp_vocab.py), or skip."""
    try:
        return LlamaCppVocab(path)
    except LlamaCppUnavailable as e:
        pytest.skip(f"llama_cpp is not usable here: {e}")


@pytest.fixture(scope="module")
def gemma_llamacpp():
    """llama.cpp's vocabulary of the same file (vocab_only), served by a child process."""
    path = gemma_path()
    if not path.is_file():
        pytest.skip(f"the Gemma-3 model is absent ({path}): `ggviz fetch gemma3-270m` fetches it")
    lc = _llamacpp(path)
    yield lc
    lc.close()


# ------------------------------------------------------------------------------------------------ Gemma-3 reference

REF = json.loads((DATA / "gemma3" / "gemma3_tokenize.json").read_text(encoding="utf-8"))


def test_gemma_vocab_loads_as_spm(gemma):
    assert gemma.type == "SPM" and gemma.get_type() == LLAMA_VOCAB_TYPE_SPM and gemma.n_tokens == 262_144
    # from the GGUF: BOS 2 added, EOS 1, UNK 3, PAD 0, no space prefix (Gemma turns SPM's default off)
    assert (gemma.bos_id, gemma.eos_id, gemma.unk_id, gemma.pad_id) == (2, 1, 3, 0)
    assert gemma.add_bos and not gemma.add_eos and not gemma.add_space_prefix
    assert gemma.nl_id == gemma.byte_to_token(0x0A) == gemma.text_to_token("<0x0A>")
    assert gemma.is_eog(1) and gemma.is_eog(gemma.text_to_token("<end_of_turn>"))
    assert gemma.token_get_type(gemma.text_to_token("<0x41>")) == TokenType.BYTE


@pytest.mark.parametrize("case", REF["tokenize"], ids=lambda c: repr(c["text"])[:40])
def test_gemma_reference_tokenize(gemma, case):
    assert gemma.tokenize(case["text"], add_special=True, parse_special=True) == case["ids"]


@pytest.mark.parametrize("case", REF["prompts"] + [REF["seq1"]], ids=lambda c: repr(c["text"])[:30])
def test_gemma_reference_prompts_and_text(gemma, case):
    """The greedy prompts and the 90-token teacher-forced text of the reference captures."""
    assert gemma.tokenize(case["text"], add_special=True, parse_special=True) == case["ids"]


def test_gemma_reference_roundtrip(gemma):
    """Detokenizing without BOS gives the text back (the strings need no byte the vocabulary lacks)."""
    for case in REF["tokenize"]:
        assert gemma.detokenize(case["ids"], remove_special=True, unparse_special=True) == case["text"]


# ------------------------------------------------------------------------------------------------ llama.cpp's vectors

def read_vectors(name: str) -> list[tuple[bytes, list[int]]]:
    """test-tokenizer-0.cpp's read_tests: inputs split at "\\n__ggml_vocab_test__\\n", one output line each."""
    raw = (VECTORS / f"{name}.inp").read_bytes()
    sep = b"\n__ggml_vocab_test__\n"
    inp, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        if nxt < 0:
            inp.append(raw[pos:])
            break
        inp.append(raw[pos:nxt])
        pos = nxt + len(sep)
    out = (VECTORS / f"{name}.out").read_text(encoding="utf-8").split("\n")
    assert len(out) >= len(inp)
    return [(s, [int(t) for t in o.split()]) for s, o in zip(inp, out)]


@pytest.mark.parametrize("name", ["ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf"])
def test_llamacpp_spm_vectors(name):
    vocab = Vocab.from_gguf_kv(gguf_file.load_gguf(VECTORS / name).kv)
    assert vocab.type == "SPM" and vocab.add_space_prefix      # the SPM default: no GGUF key overrides it
    cases = read_vectors(name)
    assert len(cases) == 46
    bad = [(s, vocab.tokenize(s, add_special=False, parse_special=False), ids) for s, ids in cases
           if vocab.tokenize(s, add_special=False, parse_special=False) != ids]
    assert not bad, bad[:3]


def test_llamacpp_spm_vectors_detokenize():
    """llama_detokenize of the vector outputs, against the installed llama.cpp on the same vocabulary."""
    name = "ggml-vocab-llama-spm.gguf"
    vocab = Vocab.from_gguf_kv(gguf_file.load_gguf(VECTORS / name).kv)
    lc = _llamacpp(VECTORS / name)
    try:
        items = [([1, *ids], *flags) for _, ids in read_vectors(name) for flags in ((False, False), (True, True))]
        want = lc.detokenize(items)
    finally:
        lc.close()
    for (ids, rs, us), w in zip(items, want):
        assert vocab.detokenize_bytes(ids, rs, us) == w


# ------------------------------------------------------------------------------------------------ hand-checked cases

def tiny_vocab(scores: dict[str, float], add_space_prefix=None, extra_special=()) -> Vocab:
    """<unk> <s> </s>, the 256 byte tokens, then the given pieces with their scores (NORMAL) and specials."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    sc = [0.0] * len(tokens)
    for text, s in scores.items():
        tokens.append(text)
        types.append(TokenType.NORMAL)
        sc.append(s)
    for text in extra_special:
        tokens.append(text)
        types.append(TokenType.CONTROL)
        sc.append(0.0)
    return Vocab(model="llama", pre="default", tokens=tokens, token_types=[int(t) for t in types], scores=sc,
                 add_space_prefix=add_space_prefix)


def pieces(v: Vocab, ids) -> list[str]:
    return [v.tokens[i] for i in ids]


def test_spm_merges_highest_score_first():
    v = tiny_vocab({"a": -1, "b": -1, "c": -1, "ab": -5, "bc": -2, "▁": -1})
    # "▁abc": pairs ab (-5) and bc (-2): bc merges first, and a+bc is no token: [▁, a, bc]
    assert pieces(v, v.tokenize("abc", add_special=False)) == ["▁", "a", "bc"]
    # with "abc" a token, the new pair a+bc enters the queue after the merge and merges too
    v = tiny_vocab({"a": -1, "b": -1, "c": -1, "ab": -5, "bc": -2, "abc": -3, "▁": -1})
    assert pieces(v, v.tokenize("abc", add_special=False)) == ["▁", "abc"]


def test_spm_equal_scores_merge_leftmost_first():
    """llm_bigram_spm::comparator: equal scores -> the smaller left index wins."""
    v = tiny_vocab({"a": -1, "b": -1, "ab": -2, "ba": -2}, add_space_prefix=False)
    assert pieces(v, v.tokenize("aba", add_special=False)) == ["ab", "a"]
    assert pieces(v, v.tokenize("bab", add_special=False)) == ["ba", "b"]
    v2 = tiny_vocab({"a": -1, "b": -1, "ab": -3, "ba": -2}, add_space_prefix=False)
    assert pieces(v2, v2.tokenize("aba", add_special=False)) == ["a", "ba"]
    trace = v.spm_trace("abab")
    assert [(m.left, m.right) for m in trace][:1] == [(b"a", b"b")] and trace[0].score == -2


def test_spm_byte_fallback_and_space_escaping():
    v = tiny_vocab({"▁": -1, "h": -1, "i": -1, "▁h": -2, "hi": -2.5, "▁hi": -1.5})
    ids = v.tokenize("hi é", add_special=True)
    # BOS, then "▁hi▁é": ▁h (-2) beats hi (-2.5), then ▁h+i = ▁hi; "é" (C3 A9) is no token -> two byte tokens
    assert pieces(v, ids) == ["<s>", "▁hi", "▁", "<0xC3>", "<0xA9>"]
    assert v.detokenize(ids, remove_special=True) == " hi é"  # remove_special: BOS dropped, the prefix space kept
    assert v.detokenize(ids[1:]) == "hi é"                    # no BOS: the prefix space is removed
    assert v.token_to_piece(ids[1]) == b" hi" and v.token_to_piece(ids[3]) == b"\xc3"


def test_spm_space_prefix_after_special_tokens():
    """A raw fragment gets the space prefix when it follows BOS, a special token or the start (is_prev_special)."""
    v = tiny_vocab({"▁": -1, "a": -1, "▁a": -0.5}, extra_special=("<t>",))
    assert pieces(v, v.tokenize("a<t>a", add_special=False, parse_special=True)) == ["▁a", "<t>", "▁a"]
    assert pieces(v, v.tokenize("a<t>a", add_special=False, parse_special=False))[:1] == ["▁a"]
    assert pieces(v, v.tokenize("", add_special=True)) == ["<s>"]
    assert v.tokenize("", add_special=False) == []


def test_spm_short_score_or_type_arrays_are_refused():
    with pytest.raises(ValueError, match=r"Index out of array bounds for scores \(1 < 2\)"):
        Vocab(model="llama", pre="default", tokens=["<unk>", "a"], scores=[0.0], token_types=[2, 1])
    with pytest.raises(ValueError, match=r"Index out of array bounds for toktypes \(1 < 2\)"):
        Vocab(model="llama", pre="default", tokens=["<unk>", "a"], scores=[0.0, 0.0], token_types=[2])


def test_spm_missing_byte_token_is_a_clear_error():
    v = Vocab(model="llama", pre="default", tokens=["<unk>", "<s>", "</s>", "a"], scores=[0, 0, 0, -1],
              token_types=[2, 3, 3, 1], add_space_prefix=False)
    assert v.tokenize("a", add_special=False) == [3]
    with pytest.raises(KeyError, match=r"neither <0x62> nor the byte b'b'"):
        v.tokenize("b", add_special=False)


# ------------------------------------------------------------------------------------------------ differential

_ALPHABET = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 3
             + list(" " * 30 + "\t\n\r" * 3 + ".,;:!?'\"()[]{}<>/\\|-_=+*&^%$#@~`")
             + list("éèàçüöäßñøåÆŒĳǅ") + list("αβγδΩЖжщЯ") + list("数学是科学的语言ひらがなカタカナ한국어")
             + list("🚀🔥🦙👍🏽") + ["\u0301", "\u200b", "\u00a0", "\u2581", "\ufeff", "\U0001d54f", "\ue000",
                                  "\x00", "\x07", "\u0e01", "\u05d0"])
_WORDS = ["the", " the", "ggml", "tensor", "llama", "  ", "\n\n", "    ", "<start_of_turn>", "<end_of_turn>",
          "<bos>", "<eos>", "<pad>", "<unk>", "[multimodal]", "<unused5>", "<start_of_image>", "def f(x):",
          "http://example.org/a?b=c", "3.14159", "1234567", "don't", "naïve", "ﬁ"]


def random_strings(n: int, seed: int = 11) -> list[str | bytes]:
    rng = random.Random(seed)
    out: list[str | bytes] = []
    for i in range(n):
        parts = [rng.choice(_WORDS) if rng.random() < 0.25 else rng.choice(_ALPHABET)
                 for _ in range(rng.randint(0, 24))]
        s = "".join(parts)
        if i % 25 == 0:   # invalid UTF-8 as bytes: lone continuation bytes, a cut-off sequence, 0xff
            s = s.encode() + rng.choice([b"\x80", b"\xe2\x82", b"\xff", b"\xc3"]) + b"x"
        out.append(s)
    return out


def structured_strings(n: int, seed: int = 5) -> list[str]:
    """Runs of spaces, newlines and tabs of 1..70 (Gemma has user-defined tokens for runs up to 31: the longest-first
    special-token partition cuts them), HTML tags (user-defined too), words and specials."""
    rng = random.Random(seed)
    tags = ["<td>", "</td>", "<b>", "</b>", "<s>", "</s>", "<table>", "<h1>", "<code>", "<start_of_image>"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 8)):
            r = rng.random()
            if r < 0.4:
                parts.append(rng.choice(" \n\t") * rng.randint(1, 70))
            elif r < 0.6:
                parts.append(rng.choice(tags))
            else:
                parts.append(rng.choice(_WORDS + ["word", "x", "▁▁", "é"]))
        out.append("".join(parts))
    return out


def test_gemma_differential_tokenize(gemma, gemma_llamacpp):
    """300 random strings (letters, scripts, emoji, spaces, controls, special-token texts, invalid UTF-8) and 150 of
    whitespace runs and tags, all four add_special x parse_special settings: the ids equal llama.cpp's."""
    cases = [(s, a, p) for s in random_strings(300) + structured_strings(150) for a in (False, True)
             for p in (False, True)]
    want = gemma_llamacpp.tokenize([(s if isinstance(s, bytes) else s.encode("utf-8"), a, p) for s, a, p in cases])
    bad = [(s, a, p, got, w) for (s, a, p), w in zip(cases, want)
           if (got := gemma.tokenize(s, add_special=a, parse_special=p)) != w]
    assert not bad, bad[:3]


def test_gemma_differential_detokenize(gemma, gemma_llamacpp):
    """llama_detokenize (both flags) of those tokenizations, and llama_token_to_piece of 3000 ids (every special,
    byte and user-defined one among them), special on/off, lstrip 0/1."""
    strs = [s if isinstance(s, bytes) else s.encode("utf-8") for s in random_strings(300)[:150]]
    all_ids = gemma_llamacpp.tokenize([(b, True, True) for b in strs])
    items = [(ids, *flags) for ids in all_ids for flags in ((False, False), (True, False), (False, True), (True, True))]
    for (ids, rs, us), w in zip(items, gemma_llamacpp.detokenize(items)):
        assert gemma.detokenize_bytes(ids, rs, us) == w, (ids, rs, us)
    rng = np.random.default_rng(3)
    odd = [i for i in range(gemma.n_tokens) if gemma.attrs[i] & ~int(TokenAttr.NORMAL)]
    sample = sorted(set(rng.integers(0, gemma.n_tokens, 3000 - min(len(odd), 1500)).tolist()) | set(odd[:1500]))
    items = [(tid, lstrip, special) for tid in sample for special in (False, True) for lstrip in (0, 1)]
    for (tid, lstrip, special), w in zip(items, gemma_llamacpp.token_to_piece(items)):
        assert gemma.token_to_piece(tid, special, lstrip) == w, tid


# ------------------------------------------------------------------------------------------------ 60 KB text

def test_gemma_60k_text_as_llamacpp(gemma, monkeypatch):
    """The ~60 KB mixed text of tests/spm_text.py (prose, digits, scripts, emoji, whitespace runs, code, special-token
    texts, byte-fallback characters) gives llama.cpp's stored ids (tests/data/gemma3/gemma3_tokenize_60k.npz), with
    add_special + parse_special and with neither: through the compiled session and trie (vocab_fast.py) when Numba
    is there, and through the faithful Python session (spm_session) too; and both sessions agree on 150 of the random
    and whitespace-run strings of the differential test (invalid UTF-8 included), all four settings."""
    from ggviz.llama import vocab as vocab_mod
    from tests.spm_text import spm_text

    ref = np.load(DATA / "gemma3" / "gemma3_tokenize_60k.npz")
    text = spm_text(int(ref["seed"]))
    assert len(text.encode("utf-8")) == int(ref["n_bytes"])
    want = {True: ref["ids_special"].tolist(), False: ref["ids_plain"].tolist()}
    strings = random_strings(100) + structured_strings(50)
    settings = [(a, p) for a in (False, True) for p in (False, True)]

    monkeypatch.setattr(gemma, "_spm_tables", None)           # built here, dropped after (monkeypatch restores)
    monkeypatch.setattr(gemma, "_special_trie", None)
    compiled = vocab_mod._vocab_fast() is not None
    if compiled:
        for flag in (True, False):
            assert gemma.tokenize(text, flag, flag) == want[flag]
        assert gemma._spm_tables is not None and gemma._special_trie is not None    # the compiled path ran
        fast_ids = [gemma.tokenize(s, a, p) for s in strings for a, p in settings]
    # the faithful session (the special-token search keeps its trie: its Python twin is what the tests above ran)
    monkeypatch.setattr(gemma, "_spm_tables", None)
    monkeypatch.setattr(vocab_mod, "_FAST_MIN_BYTES", 1 << 62)
    assert gemma.tokenize(text, True, True) == want[True]
    if compiled:
        assert [gemma.tokenize(s, a, p) for s in strings for a, p in settings] == fast_ids
