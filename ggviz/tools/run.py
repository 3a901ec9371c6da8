"""The ``ggviz run`` command: generate text with ggviz's llama.cpp mirror, as llama.cpp's ``llama-simple`` /
``llama-cli`` do (the library part, ``generate`` / ``load_model`` / ``make_sampler``, is ``ggviz.run``).

    ggviz run -p PROMPT -n 64 [--chat] [--temp T] [-t THREADS] [-m MODEL]
"""
from __future__ import annotations

import sys

from .. import cli, llama
from ..run import generate, load_model


_FA_TYPE = {"auto": llama.LLAMA_FLASH_ATTN_TYPE_AUTO, "off": llama.LLAMA_FLASH_ATTN_TYPE_DISABLED,
            "on": llama.LLAMA_FLASH_ATTN_TYPE_ENABLED}


def main(argv=None) -> int:
    ap = cli.ArgumentParser(prog="ggviz run", description="generate text with ggviz's llama.cpp mirror")
    ap.add_argument("-m", "--model", default=None, type=cli.model_file,
                    help=cli.MODEL_HELP)
    ap.add_argument("-p", "--prompt", default="The ggml library is")
    ap.add_argument("-n", "--n-predict", type=cli.int_arg(0), default=64, help="tokens to generate (>= 0)")
    ap.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--seed", type=cli.int_arg(-1, 2**32 - 1, "a uint32; -1: a random seed, as llama.cpp's"),
                    default=1234)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--min-p", type=float, default=0.05)
    ap.add_argument("-t", "--threads", type=cli.thread_count, default=2, help=f"threads (1..{cli.MAX_THREADS})")
    ap.add_argument("-c", "--ctx-size", type=cli.int_arg(0), default=2048,
                    help="context size in tokens (0: the model's training context)")
    ap.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default="auto",
                    help="flash attention, as llama.cpp's -fa (default auto: on for the CPU)")
    ap.add_argument("--blas", action="store_true",
                    help="add the BLAS backend for the prompt's MUL_MATs, as llama.cpp built with GGML_BLAS "
                         "(default: llama.cpp's default CPU build: tinyBLAS sgemm / vec_dot)")
    ap.add_argument("--vram-budget", type=cli.float_arg(0.0, open_lo=True), default=None, metavar="GiB",
                    help="PowerInfer (PWRI) models: load <model>.generated.gpuidx, the FFN split, onto the simulated "
                         "accelerator ACCEL0 (PowerInfer's --vram-budget)")
    ap.add_argument("--hybrid", action="store_true",
                    help="PowerInfer (PWRI) models: run on the hybrid executor (thread 0 drives the accelerator, "
                         "threads 1..N-1 the CPU nodes; needs -t >= 2), as PowerInfer built with "
                         "GGML_USE_HYBRID_THREADING; default: ggml_backend_sched's splits")
    a = ap.parse_args(argv)
    if a.hybrid and a.threads < 2:
        ap.error("--hybrid needs -t 2 or more (thread 0 only drives the accelerator)")
    model = load_model(a.model, **({"vram_budget_gb": a.vram_budget} if a.vram_budget is not None else {}))
    # the prompt is echoed with the first generated piece, so that an error before it (the context, the chat
    # template, the prompt's decode) prints alone; an error or Ctrl-C later starts a new line first
    state = {"echoed": False, "mid_line": False}

    def write(text):
        if not state["echoed"]:
            state["echoed"] = True
            write(a.prompt if not a.chat else "")
        if text:
            sys.stdout.write(text)
            sys.stdout.flush()
            state["mid_line"] = not text.endswith("\n")

    try:
        g = generate(a.prompt, a.n_predict, chat=a.chat, temp=a.temp, seed=a.seed, top_k=a.top_k, top_p=a.top_p,
                     min_p=a.min_p, threads=a.threads, n_ctx=a.ctx_size, model=model, stream=write,
                     use_blas=a.blas, hybrid=a.hybrid, flash_attn_type=_FA_TYPE[a.flash_attn])
    except BaseException:
        if state["mid_line"]:
            sys.stdout.write("\n")
            sys.stdout.flush()
        raise
    g.t_load_ms += model.t_load_us / 1e3
    write("\n\n")
    print(g.timings(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(cli.command_main("run"))


if __name__ == "__main__":
    sys.exit(cli.command_main("run"))
