"""ggviz.llama.vocab against llama.cpp's tokenizer (reference captured with llama-cpp-python, see
tests/data/llamacpp/ and shared/reference/README.md)."""
from __future__ import annotations

import json
import pathlib
import time

import pytest

from ggviz.llama.unicode import BYTE_TO_UNICODE, byte_encode, cpts_from_utf8
from ggviz.llama.vocab import TokenAttr, TokenType, Vocab, _clean_spaces, byte_decode

REF = json.loads((pathlib.Path(__file__).parent / "data" / "llamacpp" / "smollm2_tokens_greedy.json")
                 .read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    from ggviz import fetch

    path = fetch.models_dir() / fetch.MODEL_FILENAME
    if not path.exists():
        try:
            path = fetch.fetch_default_model()
        except Exception as e:  # noqa: BLE001 - offline machines
            pytest.skip(f"default model unavailable: {e}")
    return Vocab.from_gguf(path)


# ------------------------------------------------------------------------------------------------ llama.cpp reference

@pytest.mark.parametrize("case", REF["tokenize"], ids=lambda c: repr(c["text"])[:40])
def test_reference_tokenize(vocab, case):
    ids = vocab.tokenize(case["text"], add_special=True, parse_special=True)
    assert ids == case["ids"]
    # the capture script detokenized with llama-cpp-python (token_to_piece, special=False), dropping a leading id 1
    ids2 = ids[1:] if ids and ids[0] == 1 else ids
    assert vocab.detokenize(ids2) == case["detok"]


@pytest.mark.parametrize("case", REF["greedy"], ids=lambda c: repr(c["prompt"])[:40])
def test_reference_prompts(vocab, case):
    assert vocab.tokenize(case["prompt"], add_special=True, parse_special=True) == case["prompt_ids"]
    assert vocab.detokenize(case["gen_ids"]) == case["gen_text"]


# ------------------------------------------------------------------------------------------------ metadata, attributes

def test_metadata(vocab):
    assert (vocab.model, vocab.pre, vocab.n_tokens, len(vocab.bpe_ranks)) == ("gpt2", "smollm", 49152, 48900)
    assert (vocab.bos_id, vocab.eos_id, vocab.unk_id, vocab.pad_id) == (1, 2, 0, 2)
    assert (vocab.add_bos, vocab.add_eos, vocab.add_space_prefix, vocab.clean_spaces) == (False, False, False, False)
    assert vocab.nl_id == 198 and vocab.token_get_text(198) == "Ċ"
    assert vocab.eog_ids == {0, 2, 4}          # <|endoftext|>, <|im_end|>, <reponame> (detected as FIM_REP)
    assert vocab.is_eog(2) and not vocab.is_eog(1)


def test_token_types_and_attrs(vocab):
    for tid in range(17):                       # <|endoftext|> .. <empty_output>
        assert vocab.token_get_type(tid) == TokenType.CONTROL
        assert vocab.is_control(tid) and not vocab.is_normal(tid)
    assert vocab.token_get_attr(504) == TokenAttr.NORMAL and vocab.token_get_type(504) == TokenType.NORMAL
    assert sum(vocab.is_normal(i) for i in range(vocab.n_tokens)) == vocab.n_tokens - 17
    assert vocab.special_tokens[0] in (9, 11, 14, 15)            # longest special text first
    assert vocab.token_to_piece(1, special=True) == b"<|im_start|>"
    assert vocab.token_to_piece(1, special=False) == b""
    assert vocab.token_to_piece(216) == b" " and vocab.token_to_piece(198) == b"\n"
    assert vocab.token_to_piece(38699, lstrip=1) == b"Hello"


def test_byte_level_mapping():
    assert len(set(BYTE_TO_UNICODE.values())) == 256
    assert BYTE_TO_UNICODE[0x20] == "Ġ" and BYTE_TO_UNICODE[0x0A] == "Ċ" and BYTE_TO_UNICODE[ord("a")] == "a"
    s = "héllo 🙂\n\t\x00"
    assert byte_decode(byte_encode(s)) == s.encode()
    assert cpts_from_utf8(b"a\xffb\xe2\x82") == "a\ufffdb\ufffd\ufffd"
    assert cpts_from_utf8("€🙂".encode()) == "€🙂"


# ------------------------------------------------------------------------------------------------ behaviour

TRICKY = [
    "", " ", "  ", "   ", "\n", "\n\n\n", " \n ", "a\n\n b", "   leading", "trailing   ", "\t\ttabs\t x",
    "x\r\ny\r\n", "12345678901234567890", "3.14e-10 1,000,000 -7 +8", "version 2.0.1-rc3",
    "日本語のテキストです。", "中文字符和标点，还有数字１２３。", "한국어 텍스트", "Ωμέγα naïve Ünïcödé façade",
    "emoji 🙂🚀👍🏽 family 👨‍👩‍👧 flags 🇫🇷", "\u00a0nbsp\u2003em\u3000ideographic space",
    "can't won't I'd we're they've you'll it's O'Neil 'quoted' ''", "'S 'T 'RE", "x" * 300,
    "a  b   c    d", "def f(x):\n    return {'k': [1, 2]}  # comment\n", "<p class=\"x\">hi</p>", "\\n \\t",
    "½ ² Ⅻ ٣", "\u0301combining e\u0301", "zero\u200bwidth", "mixed\ttab and\u2028line sep",
]


@pytest.mark.parametrize("text", TRICKY, ids=lambda s: repr(s)[:30])
def test_roundtrip(vocab, text):
    ids = vocab.tokenize(text, add_special=True, parse_special=False)
    assert vocab.detokenize(ids) == text
    assert vocab.detokenize(vocab.tokenize(text, add_special=False, parse_special=True), unparse_special=True) == text
    words = vocab.tokenize_words(text, add_special=True, parse_special=False)
    assert [i for w in words for i in w.ids] == ids
    assert "".join(w.text for w in words) == text


def test_pretokenize_smollm(vocab):
    # digits split one by one; GPT-2 regex rules: leading space joins the next word, runs of spaces keep the last one
    assert vocab.pretokenize("abc 123  x\n\n\ty's") == ["abc", " ", "1", "2", "3", " ", " x", "\n\n", "\t", "y", "'s"]
    assert vocab.pretokenize("a  ") == ["a", "  "]
    assert vocab.pretokenize(" ?! (x)") == [" ?!", " (", "x", ")"]


CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_special_tokens_parsed(vocab):
    ids = vocab.tokenize(CHAT, add_special=True, parse_special=True)
    assert ids.count(1) == 3 and ids.count(2) == 2
    assert ids[0] == 1 and ids[-3:] == [520, 9531, 198]
    assert vocab.detokenize(ids, unparse_special=True) == CHAT
    assert vocab.detokenize(ids) == CHAT.replace("<|im_start|>", "").replace("<|im_end|>", "")
    frags = vocab.partition_special(CHAT, parse_special=True)
    assert frags[0] == 1 and frags[1] == "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_special_tokens_not_parsed(vocab):
    ids = vocab.tokenize(CHAT, add_special=True, parse_special=False)
    assert not any(vocab.is_control(i) for i in ids)
    assert vocab.detokenize(ids) == CHAT
    assert len(vocab.tokenize("<|im_end|>", parse_special=False)) > 1
    assert vocab.tokenize("<|im_end|>", parse_special=True) == [2]
    # longest match first: <repo_name> vs <reponame> are different control tokens
    assert vocab.tokenize("<repo_name><reponame>", parse_special=True) == [3, 4]


def test_bytes_input(vocab):
    assert vocab.tokenize("héllo".encode()) == vocab.tokenize("héllo")
    assert vocab.tokenize(b"a\xffb") == vocab.tokenize("a\ufffdb")      # invalid UTF-8 -> U+FFFD, as llama.cpp
    assert vocab.tokenize(b"<|im_end|>x", parse_special=True) == [2, vocab.text_to_token("x")]


def test_bpe_trace(vocab):
    trace = vocab.bpe_trace(" tensor")
    assert trace[0].symbols == ("Ġt", "e", "n", "s", "o", "r") and trace[0].rank == 0
    assert trace[-1].symbols == ("Ġtensor",)
    assert [vocab.text_to_token(s) for s in trace[-1].symbols] == vocab.tokenize(" tensor")
    for m in trace:
        assert m.rank == vocab.find_bpe_rank(m.left, m.right) and m.merged == m.left + m.right
        assert m.symbols[m.index] == m.merged
    # a word always ends as tokens of the vocabulary
    for word in ["ggml_new_tensor_2d", " 🙂", " naïve", "\n\n"]:
        tr = vocab.bpe_trace(word)
        final = tr[-1].symbols if tr else tuple(byte_encode(word))
        assert all(vocab.text_to_token(s) >= 0 for s in final)
    assert vocab.bpe_trace("a") == []


def test_missing_byte_tokens_are_dropped(vocab):
    # byte 0x04 has no token in this vocabulary: llama.cpp silently drops it
    assert vocab.text_to_token(BYTE_TO_UNICODE[4]) == -1
    assert vocab.tokenize("a\x04b") == vocab.tokenize("a") + vocab.tokenize("b")


def test_clean_spaces():
    assert bytes(_clean_spaces(bytearray(b"Hello , world ! I 'm a ' b x 're y 'll"))) == \
        b"Hello, world! I'm a'b x're y 'll"
    assert bytes(_clean_spaces(bytearray(b""))) == b""


def test_speed(vocab):
    text = (pathlib.Path(__file__).read_text(encoding="utf-8") * 2)[:2048]
    vocab._bpe_cache.clear()
    t0 = time.perf_counter()
    ids = vocab.tokenize(text, add_special=True, parse_special=True)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    vocab.tokenize(text, add_special=True, parse_special=True)
    warm = time.perf_counter() - t0
    assert vocab.detokenize(ids) == text
    assert cold < 0.1 and warm < 0.05, (cold, warm)
