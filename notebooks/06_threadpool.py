# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · The CPU threadpool: plan, threads, barriers, chunks
#
# How does ggml's CPU backend spread one graph over several threads?
#
# 1. **plan** (`ggml_graph_plan`): for every node, how many threads can share it (`ggml_get_n_tasks`) and how much
#    scratch memory it needs; the work buffer is the largest need (plus a cache line per thread);
# 2. **compute** (`ggml_graph_compute`): all threads walk the node list together; for each node every thread calls
#    the kernel with its index `ith` of `nth`, then waits in `ggml_barrier` for the others;
# 3. **chunks**: mul_mat does not split its rows by `ith` once and for all; threads *claim* chunks of rows from a
#    shared counter (`current_chunk`), so a thread that finishes early takes more work.
#
# Every timeline below is recorded from a real decode step (the `cpu.node`, `cpu.chunk` and `cpu.barrier` events).

# %%
import json
import pathlib
import tempfile
from collections import defaultdict
from ggviz import ggml, viz
from ggviz.ggml.cpu import ggml_cpu
from ggviz.run import load_model
from ggviz.capture import decode_graph, decode_step
from ggviz.tools.export import chrome_trace
from ggviz.viz.widgets import exercise as ex           # predict, then reveal: answers computed from the run

model = load_model()
gf = decode_graph(model).gf        # the graph of one decode step, built (not computed)

# %% [markdown]
# ## 1. The plan for 1 to 4 threads

# %%
ex.n_tasks(next(t for t in gf.nodes if ggml.op_desc(t).startswith("SOFT_MAX")), 16)   # predict (the table stops at 4)

# %%
rows = {}
for node in gf.nodes:
    op = ggml.op_desc(node).split(" ")[0]
    r = rows.setdefault(op, {"op": op, "nodes": 0})
    r["nodes"] += 1
    for n in (1, 2, 3, 4):
        nt = ggml_cpu.get_n_tasks(node, n)                   # ggml_get_n_tasks
        r[f"n_tasks@{n}"] = max(r.get(f"n_tasks@{n}", 0), nt)
        r[f"work@{n}"] = max(r.get(f"work@{n}", 0), ggml_cpu.node_work_size(node, nt, n))
viz.Table(sorted(rows.values(), key=lambda r: -r["nodes"]), title="per op: the most threads and work bytes any node asks")

# %%
for n in (1, 2, 3, 4):
    p = ggml_cpu.graph_plan(gf, n)                           # ggml_graph_plan
    print(f"{n} thread(s): plan.n_threads = {p.n_threads}, work_size = {p.work_size:,} bytes")

# %% [markdown]
# > **Teacher note.** Views have `n_tasks = 1` (nothing to do); a softmax gets at most one thread per row. The work
# > buffer is small: a mul_mat converts its F32 input vector to the weights' dot-product type (q8 blocks) once, and
# > ROPE/SOFT_MAX need one row of scratch per thread.

# %% [markdown]
# ### One op, split by `ith` / `nth`
#
# Inside a node, an element-wise kernel such as ADD (here on F16 tensors, `ggml_compute_forward_add` →
# `binary_ops`' `apply_binary_op`) takes rows `[dr*ith, min(dr*ith + dr, nr))` with `dr = (nr + nth - 1) / nth`.
# Run the kernel as each thread *alone* and look at which rows it wrote:

# %%
import numpy as np
from ggviz.ggml.cpu import ops as cpu_ops
from ggviz.ggml.cpu.common import ComputeParams

actx = ggml.init(1 << 20)
F16 = ggml.GGML_TYPE_F16
p16 = ggml.set_name(ggml.new_tensor_2d(actx, F16, 8, 10), "p")
q16 = ggml.set_name(ggml.new_tensor_2d(actx, F16, 8, 10), "q")
s16 = ggml.set_name(ggml.add(actx, p16, q16), "p+q")
ggml.get_data(p16)[...] = 1.0
ggml.get_data(q16)[...] = 2.0
nr, nth = 10, 3
split = []
for ith in range(nth):
    ggml.get_data(s16)[...] = np.nan                          # mark every row unwritten
    cpu_ops.forward_add(ComputeParams(ith, nth, None), s16)   # ggml_compute_forward_add as thread ith of nth, alone
    done = np.nonzero(~np.isnan(ggml.get_data(s16)[0, 0, :, 0]))[0]
    split.append({"ith": ith, "nth": nth, "rows it wrote": f"{done.min()}..{done.max()}", "rows": len(done)})
viz.Table(split, title=f"ADD (F16) on {nr} rows, {nth} threads: dr = ({nr} + {nth} - 1) / {nth} = {(nr + nth - 1) // nth}")

# %%
nth2 = 4                             # change it (1 to 10), predict, then run this cell again
ggml.get_data(s16)[...] = np.nan
cpu_ops.forward_add(ComputeParams(nth2 - 1, nth2, None), s16)     # the last thread, alone
last_rows = int(np.count_nonzero(~np.isnan(ggml.get_data(s16)[0, 0, :, 0])))
ex.Exercise(f"The same ADD on {nr} rows with {nth2} threads: how many rows does the last thread (ith = {nth2 - 1}) "
            f"write?", last_rows, unit="rows", kind="rerun",
            explain=f"dr = ({nr} + {nth2} - 1) / {nth2} = {(nr + nth2 - 1) // nth2}; the last thread takes rows "
                    f"[{(nr + nth2 - 1) // nth2 * (nth2 - 1)}, {nr}): what is left, possibly nothing.")

# %% [markdown]
# *Read the code:* ggviz.ggml.cpu.ggml_cpu.graph_plan, ggviz.ggml.cpu.ggml_cpu.get_n_tasks, ggviz.ggml.cpu.ops.forward_add ↔ ggml-cpu.c ggml_graph_plan, ggml_get_n_tasks; ops.cpp ggml_compute_forward_add

# %% [markdown]
# ## 2. A real compute, thread by thread

# %%
from ggviz.llama import context_pool
from ggviz.viz.widgets.timeline import WALK_LABEL, cleanest, concurrent_chunks, machine_cores, thread_accounting


def record_step(threads=2):
    context_pool.context_pool_clear()     # a fresh context each time: no thread count carried over from the last one
    return decode_step("The ggml library is", threads=threads, model=model)   # prompt, then one recorded decode step


# on a shared machine another process may take a core in the middle of a compute: record up to 3 times, keep the
# cleanest, and say in numbers how clean it is
step, data, dist, tries = cleanest(record_step, tries=3)
tl = step.timeline                                                    # ggviz.trace.ComputeTimeline
c = tl.last
print(f"{c['n_nodes']} nodes on {c['n_threads']} threads, {(c['t_end'] - c['t_start']) / 1e6:.1f} ms")
print("recorded from the", WALK_LABEL[data["compiled"]])
print(f"kept the cleanest of {len(tries)} recording(s); share of MUL_MATs run by both threads at once: "
      f"{', '.join(f'{t:.0%}' for t in tries)}")
print("the one kept:", dist["note"].replace("; ", ";\n    "))
viz.Table([{"thread": a["thread"], "in kernels (µs)": round(a["kernel_us"]),
            "barrier: spinning (µs)": round(a["spin_us"]), "barrier: asleep (µs)": round(a["sleep_us"]),
            "pool: kickoff/join (µs)": round(a["pool_us"]), "unrecorded (µs)": round(a["other_us"]),
            "busy + wait (µs)": round(a["busy_us"] + a["wait_us"]), "wall (µs)": round(a["wall_us"]),
            "chunks claimed": a["chunks"]} for a in thread_accounting(data)],
          title="where each thread's time went (the parts add up to the compute's wall time)")

# %% [markdown]
# > **Teacher note.** This decode ran on the *compiled walk* (`ggviz/ggml/cpu/fast`: the same node loop, barrier
# > and chunk counter as ggml-cpu.c, compiled by Numba and free of the GIL), so the two threads really run at the
# > same time, as ggml's C threads do. ggml's `ggml_barrier` spins on `n_barrier_passed` until the last thread
# > arrives: orange below. The compiled walk spins the same way for about 40 µs, then sleeps on a futex (grey), a
# > ggviz addition so that a machine with more threads than free cores does not burn the core the late thread needs.
# > "Pool" is the time before a thread's first node (the kickoff wakes it) and after its last one (the join).
# > On a shared machine another process may hold a core during the compute: a thread is then descheduled, the other
# > one waits for it at every barrier, and the table shows it as long sleeps. That is why the cell above records up
# > to three times and keeps the cleanest run, and why every timeline says, under its title, how many MUL_MATs
# > really ran on both threads at once and how long each thread slept (in red, "BUSY MACHINE", when fewer than
# > half did: such a picture shows the operating system's scheduling, not ggml's).

# %%
from ggviz.viz.widgets import ThreadTimeline

# the same step recorded on 1, 3 and 4 threads too (the cleanest of 2 tries where the cores allow a clean one): the
# "threads" buttons pick the recording; on a machine with fewer cores than threads the picture says so in red
others = {n: cleanest(lambda n=n: record_step(n), tries=2 if 1 < n <= machine_cores() else 1)[0].events
          for n in (1, 3, 4)}
print(f"this machine gives this process {machine_cores()} cores")
tt = ThreadTimeline(step.events, window=40, others=others, cores=machine_cores())
tt.select(next(i for i, t in enumerate(gf.nodes) if t.name == "ffn_up-0"))
tt

# %% [markdown]
# The *threads* buttons switch to the same decode step recorded on 1, 3 and 4 threads: one thread computes every
# chunk itself, with nobody to wait for; with more threads than free cores the threads take turns on the cores, and
# the title says so in red (the printed line above says how many cores this machine gave the notebook).
#
# When the operating system gives each thread a core, both threads work on the same MUL_MAT at the same time. The
# count below says for how many MUL_MATs that happened in this recording, and the table shows a few of them: chunks
# that ran on the two threads with overlapping time spans. (The node-by-node NumPy walk, `load_model(use_extra_bufts=False)`, overlaps too, inside
# NumPy's loops, which release the GIL; but its Python between them is serialised, and a 2-thread decode there takes
# about 4 s, half of it in barriers.)

# %%
cc = concurrent_chunks(data)
print(f"{len(cc)} of {len({ch['node_n'] for ch in data['chunks']})} MUL_MATs had chunks running on both threads at once")
viz.Table([{"node": step.graph.gf.nodes[n].name, "thread a: chunk": a["chunk"], "a: µs": f"{a['t0']:.1f}–{a['t1']:.1f}",
            "thread b: chunk": b["chunk"], "b: µs": f"{b['t0']:.1f}–{b['t1']:.1f}"}
           for n, pairs in list(cc.items())[:6] for a, b in pairs[:1]])

# %% [markdown]
# *Read the code:* ggviz.ggml.cpu.ggml_cpu.graph_compute, ggviz.ggml.cpu.threadpool.graph_compute_kickoff ↔ ggml-cpu.c ggml_graph_compute, ggml_graph_compute_thread, ggml_barrier

# %% [markdown]
# ## 3. Barrier waits and chunk claims
#
# A barrier wait is time a thread had nothing to do because another thread was still busy with the same node. Where
# did the threads wait the most?

# %%
wait = defaultdict(float)
for ith, lane in c["threads"].items():
    for b in lane["barriers"]:
        wait[b["name"]] += (b["t_exit"] - b["t_enter"]) / 1e3
top = sorted(wait.items(), key=lambda kv: -kv[1])[:8]
viz.Table([{"after node": k, "waiting, all threads (µs)": round(v)} for k, v in top])

# %%
name = "ffn_up-0"
claims = []
for ith, lane in c["threads"].items():
    for ch in lane["chunks"]:
        if ch["node"] == name:
            claims.append({"thread": ith, "chunk": ch["chunk"], "rows": f"{ch['ir0'][0]}..{ch['ir0'][1] - 1}",
                           "t (µs)": round((ch["t_start"] - c["t_start"]) / 1e3, 1)})
claims.sort(key=lambda r: r["t (µs)"])
print(f"{name}: {len(claims)} chunks of rows, claimed in this order:")
viz.Table(claims)

# %% tags=["answer-in-source"] jupyter={"source_hidden": true}
per_thread = {ith: sum(r["thread"] == ith for r in claims) for ith in sorted({r["thread"] for r in claims})}
ex.Exercise(f"Thread ith always starts with chunk ith, yet which thread computes chunk {c['n_threads']} and later "
            "ones changes from run to run. Why?",
            "every further chunk goes to whichever thread increments the shared counter first",
            choices=["every further chunk goes to whichever thread increments the shared counter first",
                     "the chunks are dealt round-robin by the main thread", "the OS picks a thread for each chunk"],
            kind="why",
            explain=f"ggml_threadpool_chunk_add is an atomic fetch-and-add on current_chunk: a thread that finishes "
                    f"early (or was not descheduled) takes the next one. In this run the chunks per thread were "
                    f"{per_thread}.")

# %% [markdown]
# > **Teacher note.** Each thread starts with chunk `ith`; the shared counter (`current_chunk`, an atomic
# > fetch-and-add) then hands out the next chunk to whichever thread asks first: dynamic load balancing. On the
# > compiled walk the claims interleave as in C; a thread that was descheduled for a while finds most chunks taken.
#
# *Read the code:* ggviz.ggml.cpu.mul_mat.forward_mul_mat ↔ ggml-cpu.c ggml_compute_forward_mul_mat, ggml_compute_forward_mul_mat_one_chunk

# %% [markdown]
# ## 4. Inside one chunk: one row · column product, lane by lane
#
# A chunk of a MUL_MAT is a block of output rows; each output element is one `vec_dot` of a weight row and an
# activation column. With Q4_1 weights ggml first quantizes the column to Q8_1 blocks (32 int8 and a scale), then
# `ggml_vec_dot_q4_1_q8_1` (AVX2) works block by block on 8 float lanes: lane u takes the exact integer dot product
# of elements 4u..4u+3, scaled by `d_x·d_y` with one FMA; at the end `hsum_float_8` adds the 8 lanes in a fixed
# tree and the mins' term `summs` is added. Float addition is not associative, so this order *is* the result: the
# view recomputes it and compares the bits with the MUL_MAT's output (layer 0's `Qcur`, on the prompt).

# %%
from ggviz.viz.widgets import VecDotLanes
from ggviz.capture import capture_mul_mat

cap = capture_mul_mat(model, "Qcur-0")
lanes = VecDotLanes(cap, row=5, block=3)
st = lanes.state()
print(f"{st['node']}[{st['column']}, {st['row']}]: lanes give {st['result_bits']}, the MUL_MAT wrote "
      f"{st['output_bits']}: same bits = {st['matches_output']}")
lanes

# %% [markdown]
# *Read the code:* ggviz.ggml.cpu.quants.from_float, ggviz.ggml.cpu.quants.vec_dot ↔ arch/x86/quants.c quantize_row_q8_1, ggml_vec_dot_q4_1_q8_1

# %% [markdown]
# ## 5. The pool itself: kickoff, pause/resume, `abort_callback`
#
# `ggml_graph_compute` with no threadpool makes a *disposable* one and frees it at the end; llama.cpp keeps a
# persistent one (`ggml_threadpool_new`). Each compute starts with `ggml_graph_compute_kickoff`: it bumps the pool's
# `n_graph` counter (graph count, and in its low bits the number of threads) and, if the pool was paused, resumes
# it; idle workers sleep while the pool is paused (`ggml_threadpool_pause` / `_resume`). `cplan.abort_callback` is
# called by thread 0 after every node: returning true stops the graph at the next barrier with
# `GGML_STATUS_ABORTED` (ggml builds without OpenMP use this pool; with OpenMP, `#pragma omp parallel` replaces it
# and there is no pause/resume). Recorded from a real run:

# %%
from ggviz import trace
from ggviz.ggml.cpu import threadpool as TP

sctx = ggml.init(1 << 20)
xs = ggml.set_name(ggml.new_tensor_2d(sctx, ggml.GGML_TYPE_F32, 64, 16), "xs")
ggml.get_data(xs)[...] = 1.0
ys = ggml.set_name(ggml.add(sctx, ggml.mul(sctx, xs, xs), ggml.scale(sctx, xs, 2.0)), "ys")
gs = ggml.new_graph(sctx)
ggml.build_forward_expand(gs, ys)

params = TP.threadpool_params_default(2)
params.paused = True                                   # created asleep: the first kickoff wakes it
pool = TP.threadpool_new(params)                       # ggml_threadpool_new
calls = []
with trace.Recorder(kinds=["cpu.kickoff", "cpu.pause", "cpu.resume", "cpu.abort", "cpu.compute.end"]) as prec:
    plan = ggml_cpu.graph_plan(gs, 2, pool)
    st_ok = ggml_cpu.graph_compute(gs, plan)           # kickoff resumes the paused pool
    TP.threadpool_pause(pool)                          # ggml_threadpool_pause: idle workers go to sleep
    TP.threadpool_resume(pool)
    plan.abort_callback = lambda data: (calls.append(1), len(calls) >= 2)[1]     # stop after the 2nd node
    st_abort = ggml_cpu.graph_compute(gs, plan)
TP.threadpool_free(pool)
print(f"statuses: {st_ok} (GGML_STATUS_SUCCESS = {ggml_cpu.GGML_STATUS_SUCCESS}), then {st_abort} "
      f"(GGML_STATUS_ABORTED = {ggml_cpu.GGML_STATUS_ABORTED}) after {len(calls)} abort_callback calls")
viz.Table([{"event": e["kind"], "by": e.get("by") or e.get("state"), "thread": e.get("ith"),
            "n_graph": e.get("n_graph"), "was paused": e.get("was_paused"),
            "node": e.get("name") or e.get("node_n")} for e in prec.events], title="the pool's events, in order")

# %% [markdown]
# The whole timeline also exports as a Chrome trace-event file (`ggviz trace -o trace.json` does this from the
# command line); open it in https://ui.perfetto.dev to zoom and pan:

# %%
doc = chrome_trace(step)
path = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name     # a scratch file: write your own path
with open(path, "w") as f:
    json.dump(doc, f)
kinds = defaultdict(int)
for e in doc["traceEvents"]:
    kinds[(e["ph"], e.get("cat"))] += 1
PH = {"X": "complete (a span)", "M": "metadata", "i": "instant", "C": "counter", "B": "begin", "E": "end"}
print(f"trace.json: {len(doc['traceEvents']):,} events, {pathlib.Path(path).stat().st_size / 1024:.0f} KiB")
viz.Table([{"phase": PH.get(ph, ph), "category": cat or "—", "events": n} for (ph, cat), n in
           sorted(kinds.items(), key=lambda kv: -kv[1])], title="the trace file's events, by phase and category")

# %% [markdown]
# *Read the code:* ggviz.ggml.cpu.threadpool.threadpool_new, ggviz.ggml.cpu.threadpool.threadpool_pause, ggviz.ggml.cpu.threadpool.threadpool_resume, ggviz.ggml.cpu.threadpool.graph_compute_kickoff ↔ ggml-cpu.c ggml_threadpool_new, ggml_threadpool_pause, ggml_threadpool_resume, ggml_graph_compute_kickoff

# %% [markdown]
# ## 6. Why builds differ: one dot product through two CPU variants
#
# ggml compiles its CPU backend once per x86 *variant* and loads the best one the machine supports (`ggviz version`
# names it): `haswell` (AVX2, 256-bit registers of 8 floats) or, on a CPU with AVX-512, `zen4` (512-bit registers of
# 16 floats). ggviz computes as `haswell` by default; `GGVIZ_CPU_VARIANT=zen4` makes it compute as the AVX-512 build
# (docs/cpu-variants.md lists which kernels change). The same source, `ggml_vec_dot_f16`, becomes two different
# orders of float additions: AVX2 keeps 4 accumulators of 8 lanes (`GGML_F16_STEP` 32), AVX-512 4 accumulators of
# 16 lanes (`GGML_F16_STEP` 64), each with its own reduction tree. Below: layer 0's K·Q products of a real prompt (the
# key as stored in the F16 cache, the query converted to F16 as `vec_dot_type` asks), through both, and then one of
# them walked lane by lane.

# %%
import numpy as np
from ggviz import llama
from ggviz.ggml.cpu import vec

qk_params = llama.context_default_params()
qk_params.n_threads = qk_params.n_threads_batch = 1
qk_params.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
qk_ctx = llama.init_from_model(model, qk_params)
qk_seen = {}


def qk_keep(t, ask):                  # llama.cpp's eval callback: ask for named tensors, then receive them
    if ask:
        return t.name in ("Qcur-0", "Kcur-0")
    qk_seen.setdefault(t.name, []).append(np.array(ggml.get_data(t)))
    return True


qk_ctx.cparams.cb_eval = qk_keep
qk_ids = llama.tokenize(llama.model_get_vocab(model), "Why does my llama.cpp give other numbers than yours?")
assert llama.decode(qk_ctx, llama.batch_get_one(qk_ids)) == 0
qf = qk_seen["Qcur-0"][-1].reshape(-1, 9, 64).astype(np.float16).astype(np.float32)    # after RoPE, as F16
kf = qk_seen["Kcur-0"][-1].reshape(-1, 3, 64).astype(np.float16).astype(np.float32)    # 3 KV heads (GQA)
n_tok = qf.shape[0]
qk_pairs = [(h, t, c) for h in range(9) for t in range(n_tok) for c in range(t + 1)]     # causal: key c <= query t
dot8 = np.array([vec.vec_dot_f16_simd(kf[c:c + 1, h // 3], qf[t:t + 1, h], lanes=8)[0, 0] for h, t, c in qk_pairs])
dot16 = np.array([vec.vec_dot_f16_simd(kf[c:c + 1, h // 3], qf[t:t + 1, h], lanes=16)[0, 0] for h, t, c in qk_pairs])
qk_differ = dot8.view(np.uint32) != dot16.view(np.uint32)
print(f"{len(qk_pairs)} K·Q dot products of layer 0 ({n_tok} tokens, 9 heads): the two builds' bits differ in "
      f"{int(qk_differ.sum())} ({qk_differ.mean():.1%}), by at most "
      f"{int(np.max(np.abs(dot8.view(np.int32).astype(np.int64) - dot16.view(np.int32))))} ulp")

# %% [markdown]
# One of the products that differ, lane by lane. Head size 64: AVX2 runs the loop twice (lane e ends with
# `p[e] + p[e+32]`, rounded to float), AVX-512 once (each of its 64 lanes holds one product, exact: two fp16
# significands of 11 bits multiply exactly in float32). Then both reduce: accumulators 0+2 and 1+3, then their sum,
# then a horizontal sum of the register: AVX2 adds the 128-bit halves and then *neighbours* twice (`_mm_hadd_ps`),
# AVX-512's `_mm512_reduce_add_ps` keeps adding *halves*.

# %%
F32 = np.float32
h, t, c = qk_pairs[int(np.argmax(qk_differ))]
x, y = kf[c, h // 3], qf[t, h]
p = x * y                                            # 64 exact products
# AVX2 (haswell): 4 accumulators x 8 lanes, 2 loop steps
acc8 = (p[:32] + p[32:]).astype(F32)                 # step 1: 0 + p exactly; step 2: acc + p, rounded once per lane
s8 = (acc8[0:8] + acc8[16:24]) + (acc8[8:16] + acc8[24:32])       # GGML_F32x8_REDUCE: [0]+[2], [1]+[3], sum
t4 = s8[:4] + s8[4:]                                 # low 128 bits + high 128 bits
t2 = np.array([t4[0] + t4[1], t4[2] + t4[3]], F32)  # _mm_hadd_ps: neighbours
r8 = F32(t2[0] + t2[1])                              # _mm_hadd_ps again
# AVX-512 (zen4): 4 accumulators x 16 lanes, 1 loop step
u16 = (p[0:16] + p[32:48]) + (p[16:32] + p[48:64])   # GGML_F32x16_REDUCE: [0]+[2], [1]+[3], sum
u8 = u16[:8] + u16[8:]                               # _mm512_reduce_add_ps: 256-bit halves,
u4 = u8[:4] + u8[4:]                                 # 128-bit halves,
u2 = u4[:2] + u4[2:]                                 # 64-bit halves,
r16 = F32(u2[0] + u2[1])                             # the last two lanes
assert r8 == vec.vec_dot_f16_simd(x[None], y[None], lanes=8)[0, 0]      # the walk is the kernel ggviz runs
assert r16 == vec.vec_dot_f16_simd(x[None], y[None], lanes=16)[0, 0]


def qk_vals(v):
    v = np.atleast_1d(v)
    return "  ".join(f"{a:.7g}" for a in v)


qk_tree = [("16 partial sums", None, u16), ("8", s8, u8), ("4", t4, u4), ("2", t2, u2), ("1 (the result)", r8, r16)]
viz.Table([{"level": lvl, "AVX2 (haswell)": "—" if a is None else qk_vals(a), "AVX-512 (zen4)": qk_vals(b),
            "same bits": "" if a is None else bool(np.array_equal(np.atleast_1d(a).view(np.uint32),
                                                                   np.atleast_1d(b).view(np.uint32)))}
           for lvl, a, b in qk_tree], title=f"query token {t} · key token {c}, head {h}: the reduction trees")

# %%
exact = float(np.dot(x.astype(np.float64), y.astype(np.float64)))
print(f"AVX2 (haswell) {float(r8):.9g}  bits 0x{int(r8.view(np.uint32)):08x}")
print(f"AVX-512 (zen4) {float(r16):.9g}  bits 0x{int(r16.view(np.uint32)):08x}")
print(f"difference {float(r16) - float(r8):.3g} = {int(r16.view(np.int32)) - int(r8.view(np.int32))} ulp; "
      f"the exact dot product is {exact:.9g}")

# %% [markdown]
# Neither result is wrong: both are float32 sums of the same 64 exact products, rounded in a different order. One
# ulp here becomes a different softmax weight, a different activation rounded into Q8 blocks, and after 30 layers a
# different logit. This is why two llama.cpp builds of the same version give other numbers, and why ggviz's tests
# compare against one named build (tests/test_cpu_variant.py checks the zen4 variant against a capture of the
# AVX-512 build: all 115 logits rows of a one-batch prefill equal).

# %%
qk_first = next(np.atleast_1d(b).size for _, a, b in qk_tree[1:]
                if not np.array_equal(np.atleast_1d(a).view(np.uint32), np.atleast_1d(b).view(np.uint32)))
ex.Exercise(f"For head size {x.size}, the two trees above reach the same partial sums for a while. At which level do "
         "they first differ, counted as the number of partial sums left at that level? (Hint: write out which "
         "products end up in partial sum 0 of the 8-sum level in each build.)",
         answer=qk_first,
         explain="The loop and the accumulator reduction group the same products the same way (lane j of both "
                 "8-sum levels adds products j, j+8, ..., j+56 in the same tree), and so do the 128-bit halves. "
                 "Then AVX2's two <code>_mm_hadd_ps</code> add neighbours, (0+1)+(2+3), while AVX-512's "
                 "<code>_mm512_reduce_add_ps</code> adds halves, (0+2)+(1+3): the 2-sum level is the first to "
                 "differ, and the order of these three additions is all that separates the two builds here.")

# %% [markdown]
# *Read the code:* ggviz.ggml.cpu.vec.vec_dot_f16_simd, ggviz.ggml.cpu.cpu_feats ↔ vec.cpp ggml_vec_dot_f16; simd-mappings.h GGML_F32x8_REDUCE, GGML_F32x16_REDUCE; arch/x86/cpu-feats.cpp ggml_backend_cpu_x86_score

# %% [markdown]
# ## 7. Where the threads run: `cpumask`, `strict_cpu`, and OpenMP instead of the pool
#
# `struct ggml_threadpool_params` carries more than `n_threads`: `cpumask` (one flag per CPU; all zero: leave the
# threads where the OS puts them), `strict_cpu`, `prio` and `poll` (llama.cpp's `--cpu-mask`, `--cpu-strict`,
# `--prio`, `--poll`). `ggml_threadpool_new` gives each worker a mask with `ggml_thread_cpumask_next`: the whole mask
# when `strict_cpu` is false, else the mask's CPUs one at a time, round-robin, workers 1, 2, ... first and the main
# thread last. Each worker thread pins itself when it starts (`ggml_thread_apply_affinity`, on Linux
# `pthread_setaffinity_np`; ggviz calls `os.sched_setaffinity(0, ...)`, which on Linux pins the calling thread), and
# the main thread is pinned at creation and stays pinned. Below: two real 3-thread pools with every CPU of this
# machine in the mask, each thread reporting what the OS then says about itself.

# %%
import os

cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
main_cpus = set(cpus)
aff_rows = []
for strict in (False, True):
    tpp = TP.threadpool_params_default(3)                # ggml_threadpool_params_default
    tpp.strict_cpu = strict
    for cpu in cpus:
        tpp.cpumask[cpu] = True
    try:
        with trace.Recorder(kinds=["cpu.affinity"]) as arec, TP.threadpool_new(tpp) as pool3:
            ggml_cpu.graph_compute(gs, ggml_cpu.graph_plan(gs, 3, pool3))
            masks = {w.ith: [i for i, b in enumerate(w.cpumask) if b] for w in pool3.workers}
    finally:
        if main_cpus:
            os.sched_setaffinity(0, main_cpus)           # ggml leaves the caller pinned; the notebook puts it back
    seen = {e["ith"]: e for e in arec.events}
    for ith in (1, 2, 0):                                # in the order ggml_thread_cpumask_next hands out masks
        aff_rows.append({"strict_cpu": strict, "worker": ith, "thread": "main (the caller)" if ith == 0 else
                         "pool thread", "its cpumask: CPUs": ", ".join(map(str, masks[ith])),
                         "the OS reports, read by the thread itself": ", ".join(map(str, seen[ith]["now"]))
                         if ith in seen else "not pinned"})
viz.Table(aff_rows, title=f"3 threads, cpumask = every CPU this process may use ({len(cpus)}: "
                          f"{', '.join(map(str, cpus))})")

# %% [markdown]
# With `strict_cpu` each thread gets one CPU, and with more threads than CPUs the round-robin wraps around (two
# threads share a CPU). Pinning keeps a thread's caches warm and, on a machine with several NUMA nodes, its memory
# close (llama.cpp's `--numa`); on a shared machine it can also keep a thread waiting behind another process that
# the OS would otherwise have moved it away from.
#
# **OpenMP.** ggml built with OpenMP (`GGML_OPENMP`, on by default in llama.cpp's CMake when the compiler has it)
# does not use this pool's threads at all; ggviz mirrors the build without it. What changes:

# %%
viz.Table([
    {"": "worker threads", "ggml's own pool (ggviz)": "started once by ggml_threadpool_new; between graphs they "
     "poll, then sleep", "OpenMP build": "the OpenMP runtime's team, created at the first parallel region"},
    {"": "a graph starts", "ggml's own pool (ggviz)": "ggml_graph_compute_kickoff bumps n_graph; each worker sees it",
     "OpenMP build": "#pragma omp parallel num_threads(n): every thread calls ggml_graph_compute_thread"},
    {"": "threads in the graph", "ggml's own pool (ggviz)": "n_threads, as asked",
     "OpenMP build": "what OpenMP gave (omp_get_num_threads), written into n_graph"},
    {"": "pause / resume", "ggml's own pool (ggviz)": "ggml_threadpool_pause / _resume put workers to sleep",
     "OpenMP build": "no-ops"},
    {"": "cpumask", "ggml's own pool (ggviz)": "each thread pins itself once (above)",
     "OpenMP build": "each thread applies its mask at every compute"},
    {"": "barrier, chunks, abort", "ggml's own pool (ggviz)": "the same ggml_barrier, current_chunk, abort",
     "OpenMP build": "the same"},
], title="ggml-cpu.c, #ifdef GGML_USE_OPENMP: the two ways a graph gets its threads")

# %% [markdown]
# *Read the code:* ggviz.ggml.cpu.threadpool.threadpool_params_default, ggviz.ggml.cpu.threadpool.thread_cpumask_next, ggviz.ggml.cpu.threadpool.thread_apply_affinity ↔ ggml.c ggml_threadpool_params_default; ggml-cpu.c ggml_thread_cpumask_next, ggml_thread_apply_affinity, ggml_graph_compute
