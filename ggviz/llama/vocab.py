"""llama.cpp's tokenizers, in Python: byte-level BPE (``tokenizer.ggml.model == "gpt2"``) and SentencePiece's
SPM (``"llama"``: Gemma-3, llama-2), as ``src/llama-vocab.cpp`` (``llm_tokenizer_bpe``, ``llm_tokenizer_spm``).

This mirrors ``src/llama-vocab.cpp`` of llama.cpp for the vocabularies ggviz runs (SmolLM2: pre-tokenizer
``smollm``; the plain ``gpt-2`` family uses the same machinery); what ``src/unicode.cpp`` does for it (the byte map,
UTF-8, character classes, the regex splits) is in unicode.py:

``tokenize(text, add_special, parse_special)`` = ``llama_tokenize``:

1. **special-token partition** (``tokenizer_st_partition``): the raw text is cut around every occurrence of a
   special token (attribute CONTROL, USER_DEFINED or UNKNOWN), longest token text first.  With
   ``parse_special=False`` only USER_DEFINED tokens are cut out; ``"<|im_start|>"`` then stays plain text.
2. **pre-tokenization** (``unicode_regex_split``) of each text fragment into *words*.  For ``smollm`` two
   regexes run one after the other: ``\\p{N}`` (every digit becomes its own piece) and then GPT-2's
   ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)``, which llama.cpp runs with a
   hand-written matcher (``unicode_regex_split_custom_gpt2``) reproduced here step by step.
3. **byte-level encoding**: each word's UTF-8 bytes are mapped to printable code points (GPT-2's
   ``bytes_to_unicode``: a space becomes ``Ġ``, a newline ``Ċ``).
4. **BPE** (``llm_tokenizer_bpe_session``): the word starts as one symbol per code point; a priority queue
   repeatedly merges the adjacent pair with the lowest merge rank (ties: leftmost), until no pair is in
   ``tokenizer.ggml.merges``.  Every final symbol is looked up in the vocabulary.
5. BOS/EOS are added when ``add_special`` and the GGUF flags ``tokenizer.ggml.add_bos_token`` /
   ``add_eos_token`` ask for them (SmolLM2: neither).

``token_to_piece`` / ``detokenize`` invert this (``llama_token_to_piece`` / ``llama_detokenize``).

SPM (``LLAMA_VOCAB_TYPE_SPM``, ``llm_tokenizer_spm_session``) shares step 1 and the BOS/EOS rule (the defaults
differ: BOS on, ``add_space_prefix`` on, unless the GGUF says otherwise -- Gemma-3 turns the prefix off), then on
each text fragment: a space is prepended when ``add_space_prefix`` and the fragment follows BOS, a special token or
the start; every space becomes ``▁`` (U+2581); the fragment's UTF-8 bytes are cut into one symbol per character;
a priority queue of adjacent pairs whose concatenation is a token repeatedly merges the pair whose token has the
highest *score* (ties: the leftmost); each final symbol is its token, or, when it is none (a character outside
the vocabulary), one ``<0xXX>`` byte token per byte (byte fallback).  ``token_to_piece`` turns ``▁`` back into a
space and a byte token into its byte.
"""
from __future__ import annotations

import dataclasses
import enum
import heapq
import operator
import os
from typing import Iterable, Sequence

import numpy as np

from .unicode import UNICODE_TO_BYTE, UTF8_LEN, byte_encode, cpts_from_utf8, regex_split

__all__ = [
    "TokenType", "TokenAttr", "Vocab", "BpeMerge", "PreToken",
    "byte_decode",
    "read_tokenizer_kv", "SpmMerge", "SPM_SPACE", "LLAMA_VOCAB_TYPE_SPM", "LLAMA_VOCAB_TYPE_BPE",
]

TOKEN_NULL = -1  # LLAMA_TOKEN_NULL


class TokenType(enum.IntEnum):
    """Values of the GGUF array ``tokenizer.ggml.token_type`` (``enum llama_token_type``)."""
    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class TokenAttr(enum.IntFlag):
    """Per-token attribute bits (``enum llama_token_attr``)."""
    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


_TYPE_TO_ATTR = {
    TokenType.UNKNOWN: TokenAttr.UNKNOWN,
    TokenType.UNUSED: TokenAttr.UNUSED,
    TokenType.NORMAL: TokenAttr.NORMAL,
    TokenType.CONTROL: TokenAttr.CONTROL,
    TokenType.USER_DEFINED: TokenAttr.USER_DEFINED,
    TokenType.BYTE: TokenAttr.BYTE,
    TokenType.UNDEFINED: TokenAttr.UNDEFINED,
}
# the attribute of each token type, as a NumPy table indexed by the type (llama_vocab::load's switch)
_TYPE_LUT = np.array([int(_TYPE_TO_ATTR[TokenType(v)]) for v in range(len(TokenType))], dtype=np.int64)

# enum llama_vocab_type (llama.h), of the two implemented here
LLAMA_VOCAB_TYPE_SPM = 1   # LLaMA tokenizer based on byte-level BPE with byte fallback
LLAMA_VOCAB_TYPE_BPE = 2   # GPT-2 tokenizer based on byte-level BPE

# tokenizer.ggml.model -> llama_vocab_type (by name: "BPE", "SPM", as llama_vocab::type_name prints it)
_VOCAB_TYPES = {"gpt2": "BPE", "llama": "SPM"}

# llama_escape_whitespace: SentencePiece's meta symbol for a space, U+2581 LOWER ONE EIGHTH BLOCK
SPM_SPACE = "\u2581"
SPM_SPACE_UTF8 = SPM_SPACE.encode("utf-8")

def _check_text(text, fn: str) -> None:
    """A str must be valid Unicode: a lone surrogate (U+D800..U+DFFF, e.g. from ``'\\ud800'`` or a bad
    ``surrogateescape`` decode) has no UTF-8 encoding. llama.cpp takes ``const char *`` bytes and maps invalid UTF-8
    to U+FFFD (pass bytes for that); llama-cpp-python's ``text.encode("utf-8")`` raises on a lone surrogate before
    llama.cpp sees it -- ggviz refuses it too, naming it, instead of tokenizing its "surrogatepass" bytes."""
    if isinstance(text, str) and not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{fn}: the text has a lone surrogate U+{ord(text[e.start]):04X} at index {e.start} "
                             f"(not valid Unicode: it has no UTF-8 encoding); pass bytes to tokenize invalid UTF-8 "
                             f"(mapped to U+FFFD, as llama.cpp does)") from None


def byte_decode(text: str) -> bytes:
    """Inverse of :func:`byte_encode` as llama.cpp's ``llama_decode_text`` does it (unknown code points are
    rendered as ``[UNK_BYTE_0x..<text>]``)."""
    out = bytearray()
    for ch in text:
        b = UNICODE_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            raw = ch.encode("utf-8", "surrogatepass")
            out += b"[UNK_BYTE_0x" + raw.hex().encode() + text.encode("utf-8", "surrogatepass") + b"]"
    return bytes(out)


# pre-tokenizer name -> (regex passes, clean_spaces); only the byte-level families ggviz supports
_PRE_TOKENIZERS: dict[str, tuple[tuple[str, ...], bool]] = {}
for _name in ("smollm", "command-r"):
    _PRE_TOKENIZERS[_name] = (("digits", "gpt2"), False)
for _name in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"):
    _PRE_TOKENIZERS[_name] = (("digits", "gpt2"), True)
for _name in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
              "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais", "exaone4"):
    _PRE_TOKENIZERS[_name] = (("gpt2",), True)
for _name in ("trillion", "granite-docling"):
    _PRE_TOKENIZERS[_name] = (("gpt2",), False)


# --------------------------------------------------------------------------------------------------------------
# GGUF metadata
# --------------------------------------------------------------------------------------------------------------


def read_tokenizer_kv(path_or_reader) -> dict:
    """The ``tokenizer.*`` (and ``general.name`` / ``general.architecture``) metadata of a GGUF file as a plain
    dict of Python values, read with ``gguf.GGUFReader`` (pass a path, or a reader you already opened: opening
    one parses the whole file's metadata, which takes seconds for a 49k-token vocabulary)."""
    if isinstance(path_or_reader, (str, os.PathLike)):
        import gguf     # gguf-py (and the yaml it imports): ~70 ms that loading a model (from_gguf_kv) does not need
        reader = gguf.GGUFReader(os.fspath(path_or_reader))
    else:
        reader = path_or_reader
    kv = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.") or key in ("general.name", "general.architecture"):
            if key == "tokenizer.chat_template":
                continue
            kv[key] = field.contents()
    return kv


# --------------------------------------------------------------------------------------------------------------
# the vocabulary
# --------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BpeMerge:
    """One BPE merge: symbols ``left`` + ``right`` (adjacent, at ``index`` / ``index + 1``) became ``merged``.

    ``rank`` is the merge's line number in ``tokenizer.ggml.merges`` (lower = learnt earlier = merged first);
    ``symbols`` is the word's symbol list after the merge."""
    step: int
    rank: int
    left: str
    right: str
    merged: str
    index: int
    symbols: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class PreToken:
    """One unit of a tokenized text before BPE: a special token (``token`` set) or a pre-tokenized word
    (``text`` = the raw word, ``encoded`` = its byte-level form, ``ids`` = its BPE tokens)."""
    text: str
    encoded: str | None
    ids: tuple[int, ...]
    special: bool


@dataclasses.dataclass(frozen=True)
class SpmMerge:
    """One SPM merge: the adjacent symbols ``left`` + ``right`` became ``merged``, the token ``token`` of score
    ``score`` (the highest-scoring pair in the queue at that step; ties: the leftmost)."""
    step: int
    score: float
    token: int
    left: bytes
    right: bytes
    merged: bytes
    symbols: tuple[bytes, ...]


class Vocab:
    """A llama.cpp vocabulary (``struct llama_vocab``) loaded from GGUF metadata."""

    def __init__(self, *, model: str, pre: str, tokens: Sequence[str], token_types: Sequence[int] | None = None,
                 scores: Sequence[float] | None = None, merges: Sequence[str] = (),
                 bos_id: int | None = None, eos_id: int | None = None, unk_id: int | None = None,
                 sep_id: int | None = None, pad_id: int | None = None, mask_id: int | None = None,
                 eot_id: int | None = None, eom_id: int | None = None,
                 add_bos: bool | None = None, add_eos: bool | None = None, add_sep: bool | None = None,
                 add_space_prefix: bool | None = None, model_name: str = "", arch: str = ""):
        if model not in _VOCAB_TYPES:
            raise NotImplementedError(f"tokenizer model {model!r}: only byte-level BPE ('gpt2') and SentencePiece "
                                      "('llama') are implemented")
        self.type = _VOCAB_TYPES[model]        # llama_vocab_type: "BPE" or "SPM"
        spm = self.type == "SPM"
        pre = "default" if spm else (pre or "default")   # SPM: pre_type is always LLAMA_VOCAB_PRE_TYPE_DEFAULT
        if not spm and pre not in _PRE_TOKENIZERS:
            raise NotImplementedError(f"pre-tokenizer {pre!r} is not implemented (have: {sorted(_PRE_TOKENIZERS)})")
        self.model = model
        self.pre = pre
        self.model_name = model_name
        self.arch = arch
        self.regex_passes, self.clean_spaces = ((), False) if spm else _PRE_TOKENIZERS[pre]
        self.add_space_prefix = spm            # llama_vocab::load's per-type defaults, then the GGUF keys
        self.escape_whitespaces = False
        self.ignore_merges = False
        self.add_bos = spm
        self.add_eos = False
        self.add_sep = False
        if add_space_prefix is not None:
            self.add_space_prefix = bool(add_space_prefix)

        # tokens, attributes. Gemma has 262,144 tokens: everything per token is a dict built in C (dict(zip)) or a
        # NumPy lookup, not a Python loop (see benchmarks/bench_vocab.py)
        n = len(tokens)
        self.tokens: list[str] = [t if t != "" else f"[EMPTY_{i}]" for i, t in enumerate(tokens)] \
            if "" in tokens else list(tokens)
        self.token_to_id: dict[str, int] = dict(zip(self.tokens, range(n)))
        if len(self.token_to_id) != n:          # llama.cpp: GGML_ASSERT(id_to_token.size() == token_to_id.size())
            seen: dict[str, int] = {}
            for i, t in enumerate(self.tokens):
                if t in seen:
                    raise ValueError(f"duplicate token in vocabulary: {t!r} has ids {seen[t]} and {i}")
                seen[t] = i
        for what, arr in (("scores", scores), ("toktypes", token_types)):   # llama_vocab::load's bounds checks
            if arr is not None and len(arr) < n:
                raise ValueError(f"Index out of array bounds for {what} ({len(arr)} < {n})")
        # scores are float32 in the GGUF (int32 arrays are converted, as llama.cpp's static_cast<float>)
        self.scores: list[float] = (np.asarray(scores, dtype=np.float32).tolist() if scores is not None
                                    else [0.0] * n)
        if token_types is None:
            self.token_types: list[int] = [int(TokenType.NORMAL)] * n
            self.attrs: list[int] = [int(TokenAttr.NORMAL)] * n
        else:
            tt = np.asarray(token_types, dtype=np.int64)
            tt = np.where((tt >= 0) & (tt < len(_TYPE_LUT)), tt, int(TokenType.UNDEFINED))
            self.token_types = tt.tolist()
            self.attrs = _TYPE_LUT[tt].tolist()
        encoded = [t.encode("utf-8", "surrogatepass") for t in self.tokens]
        self._token_bytes_len = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
        self.max_token_len = int(self._token_bytes_len.max()) if n else 0

        # merges: "a b" -> rank (split at the first space after the first byte, like word.find(' ', 1))
        self.bpe_ranks: dict[tuple[str, str], int] = {}
        for rank, m in enumerate(merges):
            p = m.find(" ", 1)
            pair = (m[:p], m[p + 1:]) if p >= 0 else ("", "")
            self.bpe_ranks.setdefault(pair, rank)

        # special token ids: BPE defaults, then the GGUF keys (ids out of range are ignored / disabled)
        def _pick(default, given):
            if default is not None and default >= n:
                default = TOKEN_NULL
            if given is None:
                return default
            return int(given) if 0 <= int(given) < n else default

        self.bos_id = _pick(1 if spm else 11, bos_id)
        self.eos_id = _pick(2 if spm else 11, eos_id)
        self.unk_id = _pick(0 if spm else TOKEN_NULL, unk_id)
        self.sep_id = _pick(TOKEN_NULL, sep_id)
        self.pad_id = _pick(TOKEN_NULL, pad_id)
        self.mask_id = _pick(TOKEN_NULL, mask_id)
        self.eot_id = _pick(TOKEN_NULL, eot_id)
        self.eom_id = _pick(TOKEN_NULL, eom_id)
        self.fim_pre_id = self.fim_suf_id = self.fim_mid_id = TOKEN_NULL
        self.fim_pad_id = self.fim_rep_id = self.fim_sep_id = TOKEN_NULL
        if add_bos is not None:
            self.add_bos = bool(add_bos)
        if add_eos is not None:
            self.add_eos = bool(add_eos)
        if add_sep is not None:
            self.add_sep = bool(add_sep)
        for flag, tid, what in ((self.add_bos, self.bos_id, "bos"), (self.add_eos, self.eos_id, "eos"),
                                (self.add_sep, self.sep_id, "sep")):
            if flag and tid == TOKEN_NULL:
                raise ValueError(f"add_{what}_token is true, but {what}_token_id is not set")

        self._detect_special_tokens()

        # special-token cache for the partition: CONTROL | USER_DEFINED | UNKNOWN, longest text first
        # (llama.cpp's std::sort by length is not stable; equal lengths keep id order here)
        special = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)
        cand = np.flatnonzero(np.asarray(self.attrs, dtype=np.int64) & special)
        self.special_tokens: list[int] = cand[np.lexsort((cand, -self._token_bytes_len[cand]))].tolist()
        # token -> piece cache (llama_token_to_piece with special=true), built lazily
        self._piece_cache: dict[int, bytes] = {}
        self._bpe_cache: dict[str, tuple[int, ...]] = {}
        self._special_trie: tuple | None = None       # vocab_fast's trie of the special tokens (built on first use)
        self._special_index: dict[bool, dict] = {}     # its Python twin: the tokens by their first two str / bytes
        self._spm_tables: tuple | None = None         # vocab_fast's tables for the compiled SPM session
        # SPM: token_to_id keyed by UTF-8 bytes (BPE: built lazily, only byte_to_token uses it)
        self._bytes_to_id: dict[bytes, int] | None = dict(zip(encoded, range(n))) if spm else None
        if spm:
            # the newline token: LLaMA "<0x0A>"; none -> special_pad_id (with a warning, in llama.cpp)
            try:
                self.nl_id = self.byte_to_token(0x0A)
            except KeyError:
                self.nl_id = self.pad_id
        else:
            # newline token: tokenize("\n") without specials
            nl = self.tokenize("\n", add_special=False, parse_special=False)
            self.nl_id = nl[0] if nl else self.pad_id

    # ---------------------------------------------------------------------------------------------- loading

    @classmethod
    def from_gguf_kv(cls, kv: dict) -> "Vocab":
        """Build from GGUF metadata given as ``{key: python value}`` (``tokenizer.ggml.*`` keys)."""
        def get(key, default=None):
            v = kv.get(key, default)
            if hasattr(v, "tolist"):
                v = v.tolist()
            return v

        p = "tokenizer.ggml."
        return cls(model=get(p + "model"), pre=get(p + "pre", ""), tokens=get(p + "tokens"),
                   token_types=get(p + "token_type"), scores=get(p + "scores"), merges=get(p + "merges", []) or [],
                   bos_id=get(p + "bos_token_id"), eos_id=get(p + "eos_token_id"),
                   unk_id=get(p + "unknown_token_id"), sep_id=get(p + "seperator_token_id"),
                   pad_id=get(p + "padding_token_id"), mask_id=get(p + "mask_token_id"),
                   eot_id=get(p + "eot_token_id"), eom_id=get(p + "eom_token_id"),
                   add_bos=get(p + "add_bos_token"), add_eos=get(p + "add_eos_token"),
                   add_sep=get(p + "add_sep_token"), add_space_prefix=get(p + "add_space_prefix"),
                   model_name=get("general.name", "") or "", arch=get("general.architecture", "") or "")

    @classmethod
    def from_gguf(cls, path_or_reader) -> "Vocab":
        """Load the tokenizer of a GGUF file (a path or an open ``gguf.GGUFReader``)."""
        return cls.from_gguf_kv(read_tokenizer_kv(path_or_reader))

    def _detect_special_tokens(self) -> None:
        """llama.cpp's load-time heuristics: find EOT / FIM tokens by their text (marking them CONTROL) and build
        the end-of-generation set.  (llama.cpp walks an unordered_map here; we walk in id order.)"""
        def mark(tid):
            if not self.attrs[tid] & TokenAttr.CONTROL:
                self.attrs[tid] |= TokenAttr.CONTROL

        candidates = {
            "eot_id": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
                       "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
            "eom_id": ("<|eom_id|>",),
            "fim_pre_id": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                           "<|code_prefix|>", "<|prefix|>"),
            "fim_suf_id": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                           "<|code_suffix|>", "<|suffix|>"),
            "fim_mid_id": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                           "<|code_middle|>", "<|middle|>"),
            "fim_pad_id": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
            "fim_rep_id": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
            "fim_sep_id": ("<|file_sep|>",),
        }
        # walking the ids in order and taking the first text that matches == the smallest id among the matches
        # (the texts are unique); dict lookups keep this fast for 262k tokens
        ids_of = self.token_to_id
        for attr_name, texts in candidates.items():
            found = [ids_of[t] for t in texts if t in ids_of]
            if getattr(self, attr_name) == TOKEN_NULL and found:
                setattr(self, attr_name, min(found))
                mark(min(found))
        control = np.flatnonzero(np.asarray(self.attrs, dtype=np.int64) & int(TokenAttr.CONTROL)).tolist()
        for tid in control:                           # "unused" control tokens
            if "unused" in self.tokens[tid]:
                self.attrs[tid] |= TokenAttr.UNUSED
        eog = {t for t in (self.fim_pad_id, self.fim_rep_id, self.fim_sep_id) if t != TOKEN_NULL}
        eog_texts = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                     "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                     "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                     "<｜end▁of▁sentence｜>", "[e~["}
        for text in eog_texts:
            if text in ids_of:
                eog.add(ids_of[text])
                mark(ids_of[text])
        for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            if text in ids_of:
                self.attrs[ids_of[text]] = TokenAttr.USER_DEFINED
        for t in (self.eos_id, self.eot_id, self.eom_id):
            if t != TOKEN_NULL:
                eog.add(t)
        texts = {self.tokens[t]: t for t in eog}
        if "<|end|>" in texts and (("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
                                   or ("<|flush|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))):
            eog.discard(texts["<|end|>"])
            self.attrs[texts["<|end|>"]] = TokenAttr.USER_DEFINED
        if "<|tool_response>" in texts and "</s>" in texts:
            eog.discard(texts["</s>"])
            self.attrs[texts["</s>"]] = TokenAttr.NORMAL
        self.eog_ids: frozenset[int] = frozenset(eog)

    # ---------------------------------------------------------------------------------------------- queries

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def _id(self, tid, fn: str) -> int:
        """A token id as llama.cpp's ``id_to_token.at(id)`` takes it: an integer in [0, n_tokens) -- a Python list
        would take -1 as the last token, and a float as nothing at all."""
        try:
            i = operator.index(tid)
        except TypeError:
            raise TypeError(f"{fn}: token id must be an integer, not {type(tid).__name__}") from None
        if not 0 <= i < len(self.tokens):
            raise IndexError(f"{fn}: token id {i} out of range [0, {len(self.tokens)})")
        return i

    def token_get_text(self, tid: int) -> str:
        return self.tokens[self._id(tid, "llama_vocab_get_text")]

    def token_get_score(self, tid: int) -> float:
        return self.scores[self._id(tid, "llama_vocab_get_score")]

    def token_get_attr(self, tid: int) -> TokenAttr:
        return TokenAttr(self.attrs[self._id(tid, "llama_vocab_get_attr")])

    def token_get_type(self, tid: int) -> TokenType:
        return TokenType(self.token_types[self._id(tid, "llama_vocab::token_get_type")])

    def is_normal(self, tid: int) -> bool:
        return bool(self.attrs[self._id(tid, "llama_vocab::is_normal")] & TokenAttr.NORMAL)

    def is_control(self, tid: int) -> bool:
        return bool(self.attrs[self._id(tid, "llama_vocab_is_control")] & TokenAttr.CONTROL)

    def is_user_defined(self, tid: int) -> bool:
        return bool(self.attrs[self._id(tid, "llama_vocab::is_user_defined")] & TokenAttr.USER_DEFINED)

    def is_unknown(self, tid: int) -> bool:
        return bool(self.attrs[self._id(tid, "llama_vocab::is_unknown")] & TokenAttr.UNKNOWN)

    def is_unused(self, tid: int) -> bool:
        return bool(self.attrs[self._id(tid, "llama_vocab::is_unused")] & TokenAttr.UNUSED)

    def is_byte(self, tid: int) -> bool:
        return bool(self.attrs[self._id(tid, "llama_vocab::is_byte")] & TokenAttr.BYTE)

    def is_eog(self, tid: int) -> bool:
        """llama_vocab_is_eog: any id may be asked (LLAMA_TOKEN_NULL, out of range: False), but it is an integer."""
        try:
            return operator.index(tid) in self.eog_ids
        except TypeError:
            raise TypeError(f"llama_vocab_is_eog: token id must be an integer, not {type(tid).__name__}") from None

    def get_type(self) -> int:
        """``llama_vocab_type``: LLAMA_VOCAB_TYPE_SPM or LLAMA_VOCAB_TYPE_BPE."""
        return LLAMA_VOCAB_TYPE_SPM if self.type == "SPM" else LLAMA_VOCAB_TYPE_BPE

    def text_to_token(self, text: str) -> int:
        """The id of a token given its (byte-encoded) text, or -1."""
        return self.token_to_id.get(text, TOKEN_NULL)

    def find_bpe_rank(self, left: str, right: str) -> int:
        """Rank of the merge ``left right`` in ``tokenizer.ggml.merges``, or -1."""
        return self.bpe_ranks.get((left, right), -1)

    # ---------------------------------------------------------------------------------------------- tokenize

    def partition_special(self, text: str | bytes, parse_special: bool) -> list[str | bytes | int]:
        """``tokenizer_st_partition``: split ``text`` into raw-text fragments and special-token ids.

        Special tokens are tried longest first; each one cuts every remaining text fragment at all of its
        occurrences (left to right).  Without ``parse_special``, CONTROL and UNKNOWN tokens are not matched."""
        is_bytes = isinstance(text, (bytes, bytearray))
        frags: list[str | bytes | int] = [bytes(text) if is_bytes else text] if len(text) else []
        # ggviz: only the special tokens found in the text are tried (same fragments; llama.cpp searches all 6,414
        # of Gemma-3's in every fragment)
        for tid in self._specials_in(frags[0] if frags else "", is_bytes):
            attr = self.attrs[tid]
            if not parse_special and attr & (TokenAttr.CONTROL | TokenAttr.UNKNOWN):
                continue
            needle = self.tokens[tid]
            if is_bytes:
                needle = needle.encode("utf-8", "surrogatepass")
            out: list[str | bytes | int] = []
            for frag in frags:
                if isinstance(frag, int) or needle not in frag:
                    out.append(frag)
                    continue
                start, end = 0, len(frag)
                while True:
                    m = frag.find(needle, start, end)
                    if m < 0:
                        break
                    left_end = m
                    if attr & TokenAttr.LSTRIP:
                        while left_end > start and _is_c_space(frag[left_end - 1]):
                            left_end -= 1
                    if left_end > start:
                        out.append(frag[start:left_end])
                    out.append(tid)
                    start = m + len(needle)
                    if attr & TokenAttr.RSTRIP:
                        while start < end and _is_c_space(frag[start]):
                            start += 1
                    if start >= end:
                        break
                if start < end:
                    out.append(frag[start:end])
            frags = out
        return frags

    def _specials_in(self, text: str | bytes, is_bytes: bool) -> list[int]:
        """The special tokens (longest first) that occur in ``text`` at all: a token that is not in the text is in
        none of its fragments, and llama.cpp's loop would only search every fragment for it in vain. Gemma-3 has
        6,414 special tokens (``<unused0>`` ... ``<unused6241>``, whitespace runs, HTML tags): with Numba a byte trie
        of them is walked over the text once (vocab_fast.special_found); for short texts (or without Numba) only the
        tokens whose first two characters occur in the text are searched for."""
        if not text:
            return []
        fast = (_vocab_fast() if len(self.special_tokens) >= _TRIE_MIN_SPECIALS
                and (self._special_trie is not None or len(text) >= _FAST_MIN_BYTES) else None)
        if fast is None:
            # the tokens grouped by their first two characters (bytes): only the groups whose key is in the text
            index = self._special_index.get(is_bytes)
            if index is None:
                index = {}
                for k, tid in enumerate(self.special_tokens):
                    needle = self.tokens[tid].encode("utf-8", "surrogatepass") if is_bytes else self.tokens[tid]
                    index.setdefault(needle[:2], []).append((k, needle))
                self._special_index[is_bytes] = index
            grams = {text[i:i + 2] for i in range(len(text) - 1)}
            cand = sorted(kn for key, group in index.items() if (key in grams if len(key) == 2 else key in text)
                          for kn in group)
            return [self.special_tokens[k] for k, needle in cand if needle in text]
        if self._special_trie is None:
            needles = [self.tokens[t].encode("utf-8", "surrogatepass") for t in self.special_tokens]
            off = np.zeros(len(needles) + 1, dtype=np.int64)
            np.cumsum(np.fromiter(map(len, needles), dtype=np.int64, count=len(needles)), out=off[1:])
            self._special_trie = fast.build_trie(np.frombuffer(b"".join(needles), dtype=np.uint8), off)
        raw = text if is_bytes else text.encode("utf-8", "surrogatepass")
        found = fast.special_found(np.frombuffer(raw, dtype=np.uint8), *self._special_trie, len(self.special_tokens))
        return [self.special_tokens[i] for i in np.flatnonzero(found).tolist()]

    def pretokenize(self, text: str) -> list[str]:
        """``unicode_regex_split`` without the byte encoding: the raw words of one text fragment."""
        return regex_split(text, self.regex_passes)

    def _bpe_symbols(self, encoded: str, trace: list | None = None) -> list[str]:
        """Run the BPE merge loop of ``llm_tokenizer_bpe_session::tokenize`` on one byte-encoded word."""
        if self.ignore_merges and encoded in self.token_to_id:
            return [encoded]
        text = list(encoded)                       # symbol texts ('' once merged away)
        n = len(text)
        nxt = list(range(1, n)) + [-1]
        prv = list(range(-1, n - 1))
        ranks = self.bpe_ranks
        heap: list[tuple[int, int, int, str]] = []

        def add_bigram(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            rank = ranks.get((text[left], text[right]))
            if rank is not None:
                heapq.heappush(heap, (rank, left, right, text[left] + text[right]))

        for i in range(1, n):
            add_bigram(i - 1, i)
        step = 0
        while heap:
            rank, left, right, merged = heapq.heappop(heap)
            lt, rt = text[left], text[right]
            if not lt or not rt or lt + rt != merged:
                continue                            # outdated bigram
            text[left] = merged
            text[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            if trace is not None:
                step += 1
                symbols = tuple(t for t in text if t)
                index = sum(1 for t in text[:left] if t)
                trace.append(BpeMerge(step, rank, lt, rt, merged, index, symbols))
            add_bigram(prv[left], left)
            add_bigram(left, nxt[left])
        return [t for t in text if t]

    def _symbols_to_ids(self, symbols: Iterable[str]) -> tuple[int, ...]:
        ids: list[int] = []
        for sym in symbols:
            tid = self.token_to_id.get(sym)
            if tid is not None:
                ids.append(tid)
                continue
            # not in the vocabulary: try each UTF-8 byte of the symbol as a one-byte token text
            for b in sym.encode("utf-8", "surrogatepass"):
                tid = self.token_to_id.get(bytes([b]).decode("utf-8", "surrogateescape"))
                if tid is not None:
                    ids.append(tid)
        return tuple(ids)

    def bpe(self, encoded: str) -> tuple[int, ...]:
        """Token ids of one byte-encoded word (cached)."""
        ids = self._bpe_cache.get(encoded)
        if ids is None:
            ids = self._symbols_to_ids(self._bpe_symbols(encoded))
            if len(self._bpe_cache) > 200_000:
                self._bpe_cache.clear()
            self._bpe_cache[encoded] = ids
        return ids

    def bpe_trace(self, word: str, encoded: bool = False) -> list[BpeMerge]:
        """The merges BPE performs on one pre-tokenized word, in order.

        ``word`` is raw text (byte-encoded first) unless ``encoded``.  The starting symbols are the code points of
        the byte-encoded word; ``trace[-1].symbols`` (or the start, when there is no merge) are the final tokens."""
        enc = word if encoded else byte_encode(word)
        trace: list[BpeMerge] = []
        self._bpe_symbols(enc, trace)
        return trace

    def _fragment_text(self, frag: str | bytes) -> str:
        return cpts_from_utf8(frag) if isinstance(frag, bytes) else frag

    # ---------------------------------------------------------------------------------------------- SPM

    def _spm_bytes_to_id(self) -> dict[bytes, int]:
        """token_to_id keyed by the tokens' UTF-8 bytes: the SPM session works on bytes (a symbol may be a part of
        a character, e.g. a lone byte of invalid UTF-8)."""
        if self._bytes_to_id is None:
            self._bytes_to_id = {t.encode("utf-8", "surrogatepass"): i for i, t in enumerate(self.tokens)}
        return self._bytes_to_id

    def byte_to_token(self, ch: int) -> int:
        """``llama_vocab::byte_to_token`` (SPM): the token ``<0xXX>``, else the one-byte token; KeyError if neither."""
        ids = self._spm_bytes_to_id()
        tid = ids.get(f"<0x{ch:02X}>".encode())
        if tid is not None:
            return tid
        tid = ids.get(bytes([ch]))
        if tid is None:
            raise KeyError(f"byte_to_token: the vocabulary has neither <0x{ch:02X}> nor the byte {bytes([ch])!r}")
        return tid

    def spm_session(self, text: bytes, output: list[int], trace: list | None = None) -> None:
        """``llm_tokenizer_spm_session::tokenize``: append the tokens of one escaped text fragment to ``output``.

        Symbols are byte ranges of ``text`` (start, n) in a doubly linked list; a merged-away symbol keeps n = 0.
        The queue holds (-score, left, right, size): Python's heapq pops the smallest, llama.cpp's
        priority_queue the largest score, then (its comparator) the smallest ``left``. A popped pair is stale when
        either symbol is gone or their lengths no longer add up to ``size``."""
        ids = self._spm_bytes_to_id()
        scores = self.scores
        n_vocab = len(self.tokens)
        start: list[int] = []
        size: list[int] = []
        offs, total = 0, len(text)
        while offs < total:
            n = min(UTF8_LEN[text[offs] >> 4], total - offs)     # unicode_len_utf8 of the lead byte
            start.append(offs)
            size.append(n)
            offs += n
        count = len(start)
        if count == 0:
            return
        prev = list(range(-1, count - 1))
        nxt = list(range(1, count)) + [-1]
        queue: list[tuple[float, int, int, int]] = []
        rev_merge: dict[bytes, tuple[int, int]] = {}

        def try_add_bigram(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            piece = text[start[left]:start[left] + size[left] + size[right]]
            tid = ids.get(piece)
            if tid is None or tid >= n_vocab:
                return
            heapq.heappush(queue, (-scores[tid], left, right, len(piece)))
            rev_merge[piece] = (left, right)     # the last pair that formed this text (used by resegment)

        for i in range(1, count):
            try_add_bigram(i - 1, i)
        step = 0
        while queue:
            neg_score, left, right, n = heapq.heappop(queue)
            if size[left] == 0 or size[right] == 0 or size[left] + size[right] != n:
                continue                                              # outdated pair
            if trace is not None:
                lt, rt = text[start[left]:start[left] + size[left]], text[start[right]:start[right] + size[right]]
            size[left] += size[right]                                 # merge the right symbol into the left one
            size[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            if trace is not None:
                step += 1
                merged = lt + rt
                syms, i = [], 0
                while i != -1:
                    syms.append(text[start[i]:start[i] + size[i]])
                    i = nxt[i]
                trace.append(SpmMerge(step, -neg_score, ids[merged], lt, rt, merged, tuple(syms)))
            try_add_bigram(prev[left], left)
            try_add_bigram(left, nxt[left])

        def resegment(sym: int) -> None:
            piece = text[start[sym]:start[sym] + size[sym]]
            tid = ids.get(piece)
            if tid is not None:
                output.append(tid)
                return
            pair = rev_merge.get(piece)
            if pair is None:
                # byte fallback: a symbol that is no token (a character outside the vocabulary) -> its bytes
                output.extend(self.byte_to_token(b) for b in piece)
                return
            # (unreachable with llama.cpp's own bookkeeping -- rev_merge only holds token texts -- but mirrored)
            resegment(pair[0])
            resegment(pair[1])

        i = 0
        while i != -1:
            resegment(i)
            i = nxt[i]

    def _spm_sessions(self, escs: list[bytes]) -> list[tuple[int, ...]]:
        """The ids of :meth:`spm_session` for each escaped fragment: all of them in one call of the compiled twin
        (vocab_fast.spm_sessions) when Numba is there and the text is long enough to pay for building its tables (or
        they are built), else the faithful session one by one. A missing byte token: the faithful code runs and raises its KeyError."""
        total = sum(map(len, escs))
        fast = _vocab_fast() if self._spm_tables is not None or total >= _FAST_MIN_BYTES else None
        if fast is not None:
            if self._spm_tables is None:
                self._spm_tables = self._build_spm_tables(fast)
            seg = np.zeros(len(escs) + 1, dtype=np.int64)
            np.cumsum(np.fromiter(map(len, escs), dtype=np.int64, count=len(escs)), out=seg[1:])
            out = np.empty(total, dtype=np.int32)           # at most one token per byte
            out_off = np.empty(len(escs) + 1, dtype=np.int64)
            err = fast.spm_sessions(np.frombuffer(b"".join(escs), dtype=np.uint8), seg, *self._spm_tables,
                                    out, out_off)
            if err == 0:
                flat = out[:out_off[-1]].tolist()
                off = out_off.tolist()
                return [tuple(flat[a:b]) for a, b in zip(off, off[1:])]
        res = []
        for esc in escs:
            out_ids: list[int] = []
            self.spm_session(esc, out_ids)
            res.append(tuple(out_ids))
        return res

    def _build_spm_tables(self, fast) -> tuple:
        """vocab_fast's view of the vocabulary: the tokens' bytes concatenated, their offsets, the hash table, the
        float32 scores, the 256 byte-fallback ids (-1: none), UTF8_LEN and the longest token's length."""
        encoded = list(self._spm_bytes_to_id())           # keys in id order
        tok_bytes = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        tok_off = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(self._token_bytes_len, out=tok_off[1:])
        byte_tok = np.full(256, -1, dtype=np.int32)
        for b in range(256):
            try:
                byte_tok[b] = self.byte_to_token(b)
            except KeyError:
                pass
        return (tok_bytes, tok_off, fast.build_table(tok_bytes, tok_off), np.asarray(self.scores, dtype=np.float32),
                byte_tok, np.asarray(UTF8_LEN, dtype=np.int64), self.max_token_len)

    def spm_trace(self, text: str) -> list[SpmMerge]:
        """The merges the SPM session performs on one raw text fragment (escaped first, with the space prefix when
        the vocabulary adds one), in order; the last step's ``symbols`` (or the characters, with no merge) are the
        final pieces."""
        esc = ((" " if self.add_space_prefix else "") + text).replace(" ", SPM_SPACE).encode("utf-8", "surrogatepass")
        trace: list[SpmMerge] = []
        self.spm_session(esc, [], trace)
        return trace

    def spm_trace_unit(self, unit: PreToken) -> list[SpmMerge]:
        """The merges the SPM session performs on one raw fragment of :meth:`tokenize_words` (its ``encoded`` text:
        escaped, ▁ for spaces, with the space prefix exactly where ``tokenize`` put one)."""
        trace: list[SpmMerge] = []
        self.spm_session(unit.encoded.encode("utf-8", "surrogatepass"), [], trace)
        return trace

    def _spm_fragments(self, text: str | bytes, add_special: bool, parse_special: bool):
        """The SPM branch of ``llama_vocab::impl::tokenize``: yield (fragment or None, escaped bytes or None, ids)
        per unit: BOS, a special token, or a raw fragment (escaped, with the space prefix after BOS/special/start)."""
        if add_special and self.add_bos:
            if self.bos_id == TOKEN_NULL:
                raise ValueError("add_bos_token is true, but bos_token_id is not set")
            yield None, None, (self.bos_id,)
        units: list[tuple[str | bytes | None, bytes | None, int]] = []
        is_prev_special = True            # prefix with a space if first token
        for frag in self.partition_special(text, parse_special):
            if isinstance(frag, int):
                units.append((None, None, frag))
                is_prev_special = True
                continue
            raw = frag if isinstance(frag, bytes) else frag.encode("utf-8", "surrogatepass")
            esc = ((b" " if self.add_space_prefix and is_prev_special else b"") + raw).replace(b" ", SPM_SPACE_UTF8)
            units.append((frag, esc, TOKEN_NULL))
            is_prev_special = False
        # ggviz: the sessions of all raw fragments run together (one compiled call when the text is long)
        escs = [esc for _, esc, _ in units if esc is not None]
        ids = iter(self._spm_sessions(escs))
        for frag, esc, tid in units:
            yield (frag, esc, next(ids)) if esc is not None else (None, None, (tid,))
        if add_special and self.add_eos:
            yield None, None, (self.eos_id,)

    def tokenize(self, text: str | bytes, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """``llama_tokenize(vocab, text, ..., add_special, parse_special)``."""
        _check_text(text, "llama_tokenize")
        if self.type == "SPM":
            return [t for _, _, ids in self._spm_fragments(text, add_special, parse_special) for t in ids]
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)
        for frag in self.partition_special(text, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                continue
            for word in self.pretokenize(self._fragment_text(frag)):
                out.extend(self.bpe(byte_encode(word)))
        if add_special and self.add_eos:
            out.append(self.eos_id)
        return out

    def tokenize_words(self, text: str | bytes, add_special: bool = True,
                       parse_special: bool = False) -> list[PreToken]:
        """Like :meth:`tokenize` but keeps the intermediate units (special tokens and pre-tokenized words with
        their byte-level form and ids) for display; ``[i for u in units for i in u.ids] == tokenize(...)``.
        SPM: one unit per raw fragment (``encoded``: the escaped text, spaces as ▁)."""
        _check_text(text, "llama_tokenize")
        if self.type == "SPM":
            return [PreToken(self.tokens[ids[0]], None, ids, True) if frag is None else
                    PreToken(self._fragment_text(frag), esc.decode("utf-8", "replace"), ids, False)
                    for frag, esc, ids in self._spm_fragments(text, add_special, parse_special)]
        units: list[PreToken] = []
        if add_special and self.add_bos:
            units.append(PreToken(self.tokens[self.bos_id], None, (self.bos_id,), True))
        for frag in self.partition_special(text, parse_special):
            if isinstance(frag, int):
                units.append(PreToken(self.tokens[frag], None, (frag,), True))
                continue
            for word in self.pretokenize(self._fragment_text(frag)):
                enc = byte_encode(word)
                units.append(PreToken(word, enc, self.bpe(enc), False))
        if add_special and self.add_eos:
            units.append(PreToken(self.tokens[self.eos_id], None, (self.eos_id,), True))
        return units

    # ---------------------------------------------------------------------------------------------- detokenize

    def _piece(self, tid: int) -> bytes:
        """``token_to_piece_for_cache(tid, special=true)``."""
        p = self._piece_cache.get(tid)
        if p is None:
            attr = self.attrs[tid]
            text = self.tokens[tid]
            if attr & (TokenAttr.UNKNOWN | TokenAttr.CONTROL | TokenAttr.USER_DEFINED):
                p = text.encode("utf-8", "surrogatepass")
            elif attr & TokenAttr.NORMAL:
                # SPM: llama_unescape_whitespace (▁ -> space); BPE: the byte-level decoding
                p = text.replace(SPM_SPACE, " ").encode("utf-8", "surrogatepass") if self.type == "SPM" \
                    else byte_decode(text)
            elif attr & TokenAttr.BYTE:
                p = bytes([int(text[3:5], 16)])
            else:
                p = b""
            self._piece_cache[tid] = p
        return p

    def token_to_piece(self, tid: int, special: bool = True, lstrip: int = 0) -> bytes:
        """``llama_token_to_piece``: the bytes a token stands for.  CONTROL/UNKNOWN tokens render as their text
        only with ``special``; ``lstrip`` removes up to that many leading spaces."""
        tid = self._id(tid, "llama_token_to_piece")
        if not special and self.attrs[tid] & (TokenAttr.UNKNOWN | TokenAttr.CONTROL):
            return b""
        p = self._piece(tid)
        i = 0
        while i < lstrip and i < len(p) and p[i] == 0x20:
            i += 1
        return p[i:]

    def detokenize_bytes(self, ids: Sequence[int], remove_special: bool = False,
                         unparse_special: bool = False) -> bytes:
        """``llama_detokenize``: concatenated pieces (+ llama.cpp's optional clean-up of spaces)."""
        ids = list(ids)
        remove_space = self.add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        buf = bytearray()
        for tid in ids:
            buf += self.token_to_piece(tid, unparse_special, int(remove_space))
            remove_space = False
        if self.clean_spaces:
            buf = _clean_spaces(buf)
        return bytes(buf)

    def detokenize(self, ids: Sequence[int], remove_special: bool = False, unparse_special: bool = False) -> str:
        """:meth:`detokenize_bytes` decoded as UTF-8 (invalid sequences become U+FFFD)."""
        return self.detokenize_bytes(ids, remove_special, unparse_special).decode("utf-8", "replace")

    def __repr__(self) -> str:
        return (f"Vocab(type={self.type}, model={self.model!r}, pre={self.pre!r}, n_tokens={len(self.tokens)}, "
                f"n_merges={len(self.bpe_ranks)}, bos={self.bos_id}, eos={self.eos_id}, "
                f"add_bos={self.add_bos}, add_eos={self.add_eos})")


# The compiled paths build their tables on first use (Gemma-3: ~80 ms for the SPM session's, ~30 ms for the trie):
# a short prompt is tokenized faithfully (well under a millisecond) until a text of _FAST_MIN_BYTES has built them.
_FAST_MIN_BYTES = 256
_TRIE_MIN_SPECIALS = 256    # fewer special tokens (SmolLM2: 17): one ``in`` per token is as quick as the trie
_VOCAB_FAST: list = []


def _vocab_fast():
    """vocab_fast.py (the compiled twin), imported on first use; None without Numba or with GGVIZ_NO_NUMBA=1."""
    if not _VOCAB_FAST:
        try:
            from . import vocab_fast
        except ImportError:
            vocab_fast = None
        _VOCAB_FAST.append(vocab_fast)
    return _VOCAB_FAST[0]


def _is_c_space(c) -> bool:
    """C's isspace() on one char (str) or byte (int)."""
    if isinstance(c, str):
        return c in " \t\n\v\f\r"
    return c in b" \t\n\v\f\r"


def _clean_spaces(text: bytearray) -> bytearray:
    """The three in-place clean-up passes of ``llama_detokenize`` (``clean_spaces``), byte for byte."""
    t = bytearray(text)
    # first pass: " ?", " !", " .", " ,"  -> drop the space
    total1 = len(t)
    total = 1 if total1 else 0
    for i in range(1, total1):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    # second pass: a single apostrophe between spaces " ' " -> "'"
    total2 = total
    total = 1 if total2 else 0
    i = 1
    while i < total2:
        x = t[i]
        if x == 0x27 and i + 1 < total2 and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    # third pass: " 's", " 'm", " 're", " 've" -> drop the space
    total3 = total
    total = 1 if total3 else 0
    for i in range(1, total3):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < total3:
            x1 = t[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < total3:
                x2 = t[i + 2]
                if (x1, x2) in ((0x72, 0x65), (0x76, 0x65)):
                    total -= 1
        t[total] = x
        total += 1
    return t[:total]
