"""llama.cpp's tokenizer functions (the installed ``llama_cpp``, vocab_only) served from a child process.

Why a child: the ggml oracle (libggml-python, tests/oracle) and llama_cpp ship libraries with the same names
(libggml-base.so ...). Whichever a process loads second binds to the first one's symbols: llama_cpp then fails to
load ("undefined symbol: ggml_rope_set_offset") when an earlier test used the oracle, and the oracle would run
llama.cpp's newer ggml the other way round. So the tests compute ggviz's side in-process and ask this child for
llama.cpp's.

    lc = LlamaCppVocab(path)            # raises LlamaCppUnavailable when llama_cpp cannot be imported
    lc.tokenize([(b"text", add_special, parse_special), ...])  -> [[ids], ...]
    lc.detokenize([(ids, remove_special, unparse_special), ...]) -> [bytes, ...]
    lc.token_to_piece([(tid, lstrip, special), ...])            -> [bytes, ...]
"""
from __future__ import annotations

import base64
import ctypes
import json
import subprocess
import sys


class LlamaCppUnavailable(RuntimeError):
    pass


class LlamaCppVocab:
    def __init__(self, path):
        self.proc = subprocess.Popen([sys.executable, __file__, str(path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        hello = json.loads(self.proc.stdout.readline() or '{"error": "the child exited"}')
        if "error" in hello:
            self.close()
            raise LlamaCppUnavailable(hello["error"])

    def _call(self, op: str, items):
        self.proc.stdin.write(json.dumps({"op": op, "items": items}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the llama_cpp child process died")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"llama_cpp child: {reply['error']}")
        return reply["out"]

    def tokenize(self, items):
        return self._call("tokenize", [(base64.b64encode(b).decode(), a, s) for b, a, s in items])

    def detokenize(self, items):
        return [base64.b64decode(x) for x in self._call("detokenize", [(list(map(int, i)), r, u)
                                                                        for i, r, u in items])]

    def token_to_piece(self, items):
        return [base64.b64decode(x) for x in self._call("piece", [(int(t), int(l), bool(s)) for t, l, s in items])]

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _serve(path: str) -> None:
    try:
        import llama_cpp
        llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    except Exception as e:        # reported to the parent, which skips
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return
    vp = llm._model.vocab
    print(json.dumps({"ok": True}), flush=True)

    def detok(ids, remove_special, unparse_special):
        arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
        size = 64 + 32 * len(ids)
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(vp, arr, len(ids), buf, size, remove_special, unparse_special)
        if n < 0:
            raise ValueError(f"llama_detokenize returned {n}")
        return buf.raw[:n]

    def piece(tid, lstrip, special):
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(vp, tid, buf, 256, lstrip, special)
        if n < 0:
            raise ValueError(f"llama_token_to_piece returned {n}")
        return buf.raw[:n]

    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "tokenize":
                out = [llm.tokenize(base64.b64decode(b), add_bos=a, special=s) for b, a, s in req["items"]]
            elif req["op"] == "detokenize":
                out = [base64.b64encode(detok(i, r, u)).decode() for i, r, u in req["items"]]
            else:
                out = [base64.b64encode(piece(t, l, s)).decode() for t, l, s in req["items"]]
            print(json.dumps({"out": out}), flush=True)
        except Exception as e:
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    _serve(sys.argv[1])
