"""Capture llama.cpp's compute buffer sizes for SmolLM2 (the worst-case reserve of llama_context's constructor).

Writes ``tests/data/llamacpp/smollm2_compute_buffers.json``. Needs llama-cpp-python (0.3.36 was used: llama.cpp with
ggml 0.25.3) and a C compiler; run it with the interpreter that has llama_cpp::

    /tmp/llvenv/bin/python tools/capture_llamacpp_compute_buffers.py [--model PATH] [--out PATH]

For every setting a fresh process creates a ``Llama`` (flash attention off, 1 thread, verbose) and records

* ``log_mib``: the number llama.cpp logs, ``sched_reserve: CPU compute buffer size = X MiB`` (2 decimals),
* ``bytes``: the exact size, ``ggml_backend_sched_get_buffer_size(sched, backend)`` per backend. llama.cpp does not
  export its scheduler, so a tiny ``LD_PRELOAD`` shim (compiled here) wraps ``ggml_backend_sched_new`` to remember
  the pointer; it changes nothing else,
* ``bytes_after_decode``: the same after a 6-token prefill and 16 generated tokens (decode must not grow it),
* the ``graph_reserve`` lines of the debug log (the order and shapes of the reserve graphs).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODEL = os.path.join(ROOT, "data", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
DEFAULT_OUT = os.path.join(ROOT, "tests", "data", "llamacpp", "smollm2_compute_buffers.json")

# (n_ctx, n_batch, n_ubatch)
SETTINGS = [
    (512, 512, 512),
    (1024, 512, 512),
    (2048, 512, 512),
    (256, 256, 64),
    (256, 256, 128),
    (256, 256, 256),
    (1024, 1024, 32),
    (768, 2048, 1),
]

SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
typedef void * (*sched_new_t)(void **, void **, int, size_t, bool, bool);
static void * last_sched = NULL;
void * shim_last_sched(void) { return last_sched; }
void * ggml_backend_sched_new(void ** backends, void ** bufts, int n_backends, size_t graph_size, bool parallel,
                              bool op_offload) {
    static sched_new_t real = NULL;
    if (!real) {
        void * h = dlopen(getenv("SHIM_GGML_BASE"), RTLD_NOW | RTLD_NOLOAD);
        if (!h) h = dlopen(getenv("SHIM_GGML_BASE"), RTLD_NOW);
        real = (sched_new_t) dlsym(h, "ggml_backend_sched_new");
    }
    last_sched = real(backends, bufts, n_backends, graph_size, parallel, op_offload);
    return last_sched;
}
"""

CHILD = r"""
import ctypes, json, os, sys
import llama_cpp
from llama_cpp import Llama
n_ctx, n_batch, n_ubatch = (int(x) for x in sys.argv[1:4])
model = sys.argv[4]
shim = ctypes.CDLL(os.environ["SHIM_SO"])
shim.shim_last_sched.restype = ctypes.c_void_p
base = ctypes.CDLL(os.environ["SHIM_GGML_BASE"])
base.ggml_backend_sched_get_n_backends.restype = ctypes.c_int
base.ggml_backend_sched_get_n_backends.argtypes = [ctypes.c_void_p]
base.ggml_backend_sched_get_backend.restype = ctypes.c_void_p
base.ggml_backend_sched_get_backend.argtypes = [ctypes.c_void_p, ctypes.c_int]
base.ggml_backend_sched_get_buffer_size.restype = ctypes.c_size_t
base.ggml_backend_sched_get_buffer_size.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
base.ggml_backend_name.restype = ctypes.c_char_p
base.ggml_backend_name.argtypes = [ctypes.c_void_p]

def sizes():
    s = shim.shim_last_sched()
    out = {}
    for i in range(base.ggml_backend_sched_get_n_backends(s)):
        b = base.ggml_backend_sched_get_backend(s, i)
        out[base.ggml_backend_name(b).decode()] = int(base.ggml_backend_sched_get_buffer_size(s, b))
    return out

llm = Llama(model_path=model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, flash_attn_type=0,
            n_threads=1, n_threads_batch=1, verbose=True)
after_init = sizes()
ids = llm.tokenize(b"The capital of France is", add_bos=False)
llm.eval(ids)
for _ in range(16):
    tok = int(llm.sample(top_k=1, temp=0.0))
    llm.eval([tok])
print("RESULT " + json.dumps({"bytes": after_init, "bytes_after_decode": sizes(), "n_prompt": len(ids)}), flush=True)
"""


def ggml_base_path() -> str:
    import llama_cpp
    d = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    return os.path.join(d, "libggml-base.so")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()
    import llama_cpp
    tmp = tempfile.mkdtemp(prefix="ggviz_shim_")
    src = os.path.join(tmp, "shim.c")
    so = os.path.join(tmp, "libshim.so")
    with open(src, "w") as f:
        f.write(SHIM_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", so, src, "-ldl"], check=True)
    env = dict(os.environ, LD_PRELOAD=so, SHIM_SO=so, SHIM_GGML_BASE=ggml_base_path())
    rows = []
    for n_ctx, n_batch, n_ubatch in SETTINGS:
        p = subprocess.run([sys.executable, "-c", CHILD, str(n_ctx), str(n_batch), str(n_ubatch), args.model],
                           env=env, capture_output=True, text=True, check=True)
        log = p.stderr
        res = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:])
        log_mib = {m.group(1): float(m.group(2))
                   for m in re.finditer(r"sched_reserve:\s+(\S+) compute buffer size =\s+([0-9.]+) MiB", log)}
        reserves = [dict(n_tokens=int(m.group(1)), n_seqs=int(m.group(2)), n_outputs=int(m.group(3)))
                    for m in re.finditer(r"graph_reserve: reserving a graph for ubatch with n_tokens =\s*(\d+), "
                                         r"n_seqs =\s*(\d+), n_outputs =\s*(\d+)", log)]
        ctx_line = {k: int(v) for k, v in re.findall(r"llama_context: (n_ctx|n_batch|n_ubatch)\s+= (\d+)", log)}
        graph = re.search(r"sched_reserve: graph.*", log)
        row = dict(n_ctx_param=n_ctx, n_batch_param=n_batch, n_ubatch_param=n_ubatch, **ctx_line,
                   log_mib=log_mib, **res, graph_reserve=reserves, graph_line=graph.group(0) if graph else None)
        print(json.dumps(row), flush=True)
        rows.append(row)
    data = dict(
        about=("llama.cpp's compute buffer sizes at context creation (sched_reserve: pp, tg, pp again) for "
               "SmolLM2-135M-Instruct.Q4_1, flash attention off, F16 KV cache, 1 thread. bytes = "
               "ggml_backend_sched_get_buffer_size per backend right after llama_context's constructor; "
               "bytes_after_decode = the same after a prefill and 16 generated tokens; log_mib = the logged line."),
        llama_cpp_python=llama_cpp.__version__,
        model=os.path.basename(args.model),
        settings=rows,
    )
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
