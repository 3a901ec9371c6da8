"""One fresh process of ``ggviz bench --oneshot``: ggviz or llama.cpp (llama-cpp-python), timed phase by phase.

    python oneshot_child.py ggviz|llama.cpp MODEL N_THREADS N_PREDICT PROMPT

Run by file path in a new interpreter (so that what it imports is what a user's first command imports), it prints
one JSON line: the phases' wall ms, measured from this file's first line (the interpreter's own start-up is what
the parent measures around it), and the generated text. Three parts, each on a model loaded once:

* ``oneshot``: what ``ggviz run -p PROMPT -n N_PREDICT`` does (n_ctx 2048, greedy): imports, model load, context
  creation, the prompt's decode, the first generation step (sample + decode), the other steps;
* ``first_ctx``: the model's next context, n_ctx 512: context + the 4-token prompt + the first sample (the first
  context of a fresh process when ``--first-ctx-only``);
* ``shape``: a 128-token prompt in a new context, then the first decode step after it (a new batch shape) and the
  median of the 8 steady steps after that one (alone in a process: the user's case; after ``first_ctx``: a
  process that has built other graphs).

Both libraries run the same llama.h calls in the same order, with their own default context parameters
(llama.cpp's default flash attention: auto, on for the CPU).

For ggviz it also counts, per phase, Numba's first use (keys ``numba_<phase>_*``): the ms spent holding Numba's
compiler lock (its CPU target set up on first use, then each dispatcher's machine code loaded from the on-disk
cache or compiled), how many dispatchers were loaded from the cache and how many compiled. Those counts do not
depend on the machine's load; llama.cpp's kernels are in its shared library before the first line runs.
"""
import time

T0 = time.perf_counter()

import ctypes  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

PROMPT4 = [504, 3575, 282, 4649]                  # "The capital of France" (SmolLM2's BPE)


def _ms(t):
    return (time.perf_counter() - t) * 1e3


def main(argv) -> int:
    lib, path, n_threads, n_predict, prompt = argv[0], argv[1], int(argv[2]), int(argv[3]), argv[4]
    parts = argv[5].split(",") if len(argv) > 5 else ["oneshot", "first_ctx", "shape"]
    out = {"lib": lib}
    api = _GGviz() if lib == "ggviz" else _LlamaCpp()
    out["imports_ms"] = _ms(T0)
    if parts == ["oneshot"]:
        api.as_program()
    api.numba_phase(out, "imports")
    t = time.perf_counter()
    api.load(path)
    out["load_ms"] = _ms(t)
    api.numba_phase(out, "load")
    if "oneshot" in parts:
        t = time.perf_counter()
        ctx = api.new_ctx(2048, n_threads)
        out["ctx_ms"] = _ms(t)
        api.numba_phase(out, "ctx")
        t = time.perf_counter()
        ids = api.tokenize(prompt)
        out["tokenize_ms"] = _ms(t)
        smpl = api.greedy()
        t = time.perf_counter()
        api.decode(ctx, ids)
        out["prompt_ms"] = _ms(t)
        api.numba_phase(out, "prompt")
        pieces, steps = [], []
        for i in range(n_predict):
            t = time.perf_counter()
            tok = api.sample(smpl, ctx)
            if api.is_eog(tok):
                break
            pieces.append(api.piece(tok))
            if i < n_predict - 1:
                api.decode(ctx, [tok])
            steps.append(_ms(t))
        out["first_step_ms"] = steps[0] if steps else 0.0
        api.numba_phase(out, "steps")
        out["rest_ms"] = sum(steps[1:])
        out["steps_ms"] = sum(steps)
        out["steady_step_ms"] = statistics.median(steps[1:]) if len(steps) > 1 else 0.0
        out["text"] = prompt + "".join(pieces)
        out["oneshot_ms"] = _ms(T0)
        api.free(ctx)
    if "first_ctx" in parts:
        smpl = api.greedy()
        t = time.perf_counter()
        ctx = api.new_ctx(512, n_threads)
        out["fc_ctx_ms"] = _ms(t)
        api.numba_phase(out, "fc_ctx")
        t1 = time.perf_counter()
        api.decode(ctx, PROMPT4)
        out["fc_prompt_ms"] = _ms(t1)
        api.numba_phase(out, "fc_prompt")
        t1 = time.perf_counter()
        api.sample(smpl, ctx)
        out["fc_sample_ms"] = _ms(t1)
        out["first_ctx_ms"] = _ms(t)
        api.free(ctx)
    if "shape" in parts:
        prompt128 = [200 + (i * 7919) % 39800 for i in range(128)]
        ctx = api.new_ctx(512, n_threads)
        api.decode(ctx, prompt128)
        t = time.perf_counter()
        api.decode(ctx, [prompt128[-1]])
        out["shape_first_ms"] = _ms(t)
        steady = []
        for _ in range(8):
            t = time.perf_counter()
            api.decode(ctx, [prompt128[0]])
            steady.append(_ms(t))
        out["shape_steady_ms"] = statistics.median(steady)
        api.free(ctx)
    print(json.dumps(out))
    return 0


class _GGviz:
    def __init__(self):
        import atexit
        import gc

        # as the `ggviz run` program imports its command (ggviz/cli.py: _cmd_module): the collector paused, then
        # what was imported frozen out of its way
        gc.disable()
        try:
            from ggviz import llama
        finally:
            gc.freeze()
            gc.enable()
        self.L = llama
        atexit.register(gc.freeze)    # as the `ggviz run` program exits (ggviz/cli.py: main)
        try:
            from numba.core import event
            from numba.core.dispatcher import Dispatcher
        except ImportError:         # no fast path: nothing to count
            self._lock = None
            return
        self._Dispatcher = Dispatcher
        self._lock = event.TimingListener()      # time inside Numba's global compiler lock, summed
        event.register("numba:compiler_lock", self._lock)
        self._seen = (0.0, 0, 0)

    def numba_phase(self, out, phase):
        """Numba's work since the previous call: ms in its compiler lock, dispatchers loaded from its cache,
        dispatchers compiled (each dispatcher's own counters, over the ggviz modules that define them)."""
        if self._lock is None:
            return
        import sys as _sys
        ds = {id(v): v for name, m in list(_sys.modules.items()) if name.startswith("ggviz.") and m is not None
              for v in vars(m).values() if isinstance(v, self._Dispatcher)}
        hits = sum(sum(d._cache_hits.values()) for d in ds.values())
        misses = sum(sum(d._cache_misses.values()) for d in ds.values())
        lock_ms = self._lock.duration * 1e3 if self._lock.done else 0.0
        l0, h0, m0 = self._seen
        out[f"numba_{phase}_lock_ms"] = lock_ms - l0
        out[f"numba_{phase}_loaded"] = hits - h0
        out[f"numba_{phase}_compiled"] = misses - m0
        self._seen = (lock_ms, hits, misses)

    def as_program(self):
        """The one-shot part alone is the `ggviz run` program: its model and context, kept until it exits, are
        frozen out of the collector's way as that program does (ggviz/cli.py: _cmd_module)."""
        from ggviz.ggml import memory
        memory.gc_freeze_after_paused()

    def load(self, path):
        self.model = self.L.model_load_from_file(path, self.L.model_default_params())
        self.vocab = self.L.model_get_vocab(self.model)

    def new_ctx(self, n_ctx, n_threads):
        cp = self.L.context_default_params()
        cp.n_ctx = n_ctx
        cp.n_threads = cp.n_threads_batch = n_threads
        return self.L.init_from_model(self.model, cp)

    def tokenize(self, text):
        return self.L.tokenize(self.vocab, text, add_special=True, parse_special=True)

    def greedy(self):
        ch = self.L.sampler_chain_init()
        self.L.sampler_chain_add(ch, self.L.sampler_init_greedy())
        return ch

    def decode(self, ctx, toks):
        assert self.L.decode(ctx, self.L.batch_get_one(list(toks))) == 0

    def sample(self, smpl, ctx):
        return self.L.sampler_sample(smpl, ctx, -1)

    def is_eog(self, tok):
        return self.L.vocab_is_eog(self.vocab, tok)

    def piece(self, tok):
        return self.L.token_to_piece(self.vocab, tok, 0, False).decode("utf-8", "replace")

    def free(self, ctx):
        self.L.free(ctx)


class _LlamaCpp:
    def numba_phase(self, out, phase):
        pass

    def as_program(self):         # (C: no collector to keep out of the way)
        pass

    def __init__(self):
        import llama_cpp as L
        try:     # errors only, as Llama(verbose=False)
            from llama_cpp import _logger
            _logger.set_verbose(False)
        except (ImportError, AttributeError):
            pass
        self.L = L
        L.llama_backend_init()

    def load(self, path):
        L = self.L
        self.model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)

    def new_ctx(self, n_ctx, n_threads):
        cp = self.L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_threads = cp.n_threads_batch = n_threads
        return self.L.llama_init_from_model(self.model, cp)

    def tokenize(self, text):
        b = text.encode()
        arr = (self.L.llama_token * (len(b) + 8))()
        n = self.L.llama_tokenize(self.vocab, b, len(b), arr, len(arr), True, True)
        return list(arr[:n])

    def greedy(self):
        L = self.L
        ch = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        L.llama_sampler_chain_add(ch, L.llama_sampler_init_greedy())
        return ch

    def decode(self, ctx, toks):
        arr = (self.L.llama_token * len(toks))(*toks)
        assert self.L.llama_decode(ctx, self.L.llama_batch_get_one(arr, len(toks))) == 0

    def sample(self, smpl, ctx):
        return int(self.L.llama_sampler_sample(smpl, ctx, -1))

    def is_eog(self, tok):
        return bool(self.L.llama_vocab_is_eog(self.vocab, tok))

    def piece(self, tok):
        buf = (ctypes.c_char * 64)()
        n = self.L.llama_token_to_piece(self.vocab, tok, buf, 64, 0, False)
        return bytes(buf[:n]).decode("utf-8", "replace")

    def free(self, ctx):
        self.L.llama_free(ctx)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
