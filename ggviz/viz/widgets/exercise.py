"""Predict, then reveal: a question about a real run, the learner's answer checked against the run's own value.

Not a ggml source file: the notebooks' exercises. The answer is never written into the notebook: it is a value the
cell computes from the engine's objects (a tensor's ``nb`` after a permute, the gallocr buffer size, the number of
scheduler splits, the thread that claimed a chunk ...), handed to ``Exercise(question, answer=...)``. ``check`` parses
what the learner typed ("[4, 8, 24, 96]", "1536", "thread 1") and compares it with that value; ``reveal`` shows it
with the explanation. The static rendering (an executed notebook without a kernel, the book) shows the question with
the answer folded in a ``<details>`` element, so a reader can still predict before unfolding it.

Three kinds (``kind``), each labelled on the box: ``predict`` (a number, before the run shows it), ``rerun`` (change a
parameter in the cell, predict, run it again: the answer is computed from the changed run), ``why`` (pick the reason;
the explanation gives the run's numbers that show it).
"""
from __future__ import annotations

import re

import ipywidgets as W
import numpy as np

from ... import ggml
from ...ggml import alloc
from ...ggml.cpu import ggml_cpu
from .. import graph_dot as G
from ._base import VizWidget, esc

KINDS = {"predict": "Predict a number.", "rerun": "Change, predict, rerun.", "why": "Explain."}
_NUM = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


def _md(text: str) -> str:
    """The question as HTML: escaped, with `code` spans."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", esc(text))


def _numbers(text: str) -> list[float]:
    return [float(x) for x in _NUM.findall(text.replace(",", " ").replace("_", ""))]


class Exercise(VizWidget):
    """A question whose answer comes from a real run.

    ``answer``: an int, float, str, or a sequence of numbers (compared element by element); ``rel_tol`` for floats;
    ``choices``: offer these strings (the answer must be one of them); ``explain``: shown with the revealed answer
    (HTML allowed: it is the notebook author's text); ``unit``: printed after the answer; ``kind``: one of ``KINDS``."""

    def __init__(self, question: str, answer, explain: str = "", choices=None, rel_tol: float = 1e-3,
                 unit: str = "", kind: str = "predict"):
        if answer is None:
            raise ValueError("an exercise needs the value computed from the run as its answer")
        if kind not in KINDS:
            raise ValueError(f"exercise kind {kind!r} is not one of {sorted(KINDS)}")
        if isinstance(answer, np.generic):
            answer = answer.item()
        if isinstance(answer, (tuple, list, np.ndarray)):
            answer = tuple(a.item() if isinstance(a, np.generic) else a for a in np.asarray(answer).reshape(-1))
        if choices is not None:
            choices = [str(c) for c in choices]
            if str(answer) not in choices:
                raise ValueError(f"the answer {answer!r} is not one of the choices {choices}")
        self.question, self.answer, self.explain = question, answer, explain
        self.choices, self.rel_tol, self.unit, self.kind = choices, rel_tol, unit, kind
        self.attempts: list = []            # (what the learner gave, whether it was right)
        self.revealed = False

    # ---- checking ---------------------------------------------------------------------------------------------
    def is_correct(self, given) -> bool:
        """Whether ``given`` (what the learner typed or chose, or a value) is the answer."""
        a = self.answer
        if isinstance(a, bool) or (isinstance(a, str) and not _NUM.fullmatch(a.strip())):
            return str(given).strip().lower() == str(a).strip().lower()
        if isinstance(given, str):
            nums = _numbers(given)
        elif isinstance(given, (tuple, list, np.ndarray)):
            nums = [float(x) for x in np.asarray(given).reshape(-1)]
        else:
            nums = [float(given)]
        want = [float(x) for x in a] if isinstance(a, tuple) else [float(a)]
        if len(nums) != len(want):
            return False
        if all(float(w).is_integer() for w in want) and not isinstance(a, float):
            return all(n == w for n, w in zip(nums, want))
        return all(abs(n - w) <= self.rel_tol * max(abs(w), 1e-30) for n, w in zip(nums, want))

    def check(self, given) -> bool:
        ok = self.is_correct(given)
        self.attempts.append((given, ok))
        self._changed()
        return ok

    def reveal(self):
        self.revealed = True
        self._changed()
        return self

    def answer_text(self) -> str:
        a = self.answer
        s = "[" + ", ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in a) + "]" if isinstance(a, tuple) \
            else (f"{a:g}" if isinstance(a, float) else str(a))
        return s + (f" {self.unit}" if self.unit else "")

    def state(self) -> dict:
        return {"question": self.question, "kind": self.kind, "attempts": len(self.attempts),
                "last_correct": self.attempts[-1][1] if self.attempts else None, "revealed": self.revealed,
                "answer": self.answer if self.revealed else None, "choices": self.choices}

    # ---- drawing ------------------------------------------------------------------------------------------------
    _BOX = "border-left:4px solid #7e57c2;background:#f3effa;padding:6px 10px;margin:6px 0"

    def _answer_html(self) -> str:
        return (f"<b>Answer:</b> <code>{esc(self.answer_text())}</code>"
                + (f"<div style='margin-top:4px'>{self.explain}</div>" if self.explain else ""))

    def to_html(self) -> str:
        ch = ("<div>Choices: " + ", ".join(f"<code>{esc(c)}</code>" for c in self.choices) + "</div>"
              if self.choices else "")
        return (f"<div class='ggv-exercise' data-kind='{self.kind}' style='{self._BOX}'>"
                f"<b>{KINDS[self.kind]}</b> {_md(self.question)}{ch}"
                f"<details style='margin-top:4px'><summary>Show the answer (computed from this run)</summary>"
                f"<div class='ggv-answer'>{self._answer_html()}</div></details></div>")

    def _build(self):
        if self.choices:
            self._w_in = W.Dropdown(options=self.choices, value=None, description="answer")
        else:
            self._w_in = W.Text(placeholder="your prediction", description="answer")
        self._w_check = W.Button(description="Check", button_style="primary")
        self._w_reveal = W.Button(description="Reveal")
        self._w_fb = W.HTML()
        self._w_check.on_click(lambda _b: self.check(self._w_in.value if self._w_in.value is not None else ""))
        self._w_reveal.on_click(lambda _b: self.reveal())
        return W.VBox([W.HTML(f"<div style='{self._BOX}'><b>{KINDS[self.kind]}</b> {_md(self.question)}</div>"),
                       W.HBox([self._w_in, self._w_check, self._w_reveal]), self._w_fb])

    def _refresh(self):
        parts = []
        if self.attempts:
            given, ok = self.attempts[-1]
            parts.append(f"<span style='color:{'#2e7d32' if ok else '#c62828'}'>"
                         f"{'✔ right' if ok else '✘ not quite'}: {esc(given)}</span>"
                         f" ({len(self.attempts)} tr{'y' if len(self.attempts) == 1 else 'ies'})")
        if self.revealed:
            parts.append(self._answer_html())
        self._w_fb.value = "<br>".join(parts)


# =================================================================================================================
# the notebooks' exercises: each computes its answer from real engine objects (a scratch context where the question
# is about what a call *would* do, so that the notebook's own objects stay as they are)
# =================================================================================================================

def permute_nb(a, axes=(1, 0, 2, 3)) -> Exercise:
    """nb of ``ggml_permute(ctx, a, *axes)``: the view is made in a scratch context from a tensor like ``a``."""
    scratch = ggml.init(1 << 16, no_alloc=True)
    like = ggml.new_tensor(scratch, a.type, 4, [int(x) for x in a.ne])
    p = ggml.permute(scratch, like, *axes)
    ne = [int(x) for x in a.ne]
    nb = [int(x) for x in a.nb]
    return Exercise(f"`a` is {ggml.type_name(a.type)} with ne = {ne} and nb = {nb}. ggml_permute(ctx, a, "
                    f"{', '.join(map(str, axes))}) makes a view. What is the view's nb (4 numbers, bytes)?",
                    tuple(int(x) for x in p.nb),
                    explain="ggml_permute moves nb[i] (and ne[i]) to position axes[i]: the bytes stay where they "
                            "are, only the strides that walk them are shuffled.")


def tensor_cost(typ: int, ne) -> Exercise:
    """How much ``ggml_used_mem`` grows when a tensor of ``typ``/``ne`` is created (in a scratch context)."""
    scratch = ggml.init(1 << 20)
    before = ggml.used_mem(scratch)
    ggml.new_tensor(scratch, typ, len(ne), list(ne))
    grew = ggml.used_mem(scratch) - before
    return Exercise(f"A new {ggml.type_name(typ)} tensor with ne = {list(ne)} in a context that allocates data: by "
                    f"how many bytes does ggml_used_mem grow?", int(grew), unit="bytes",
                    explain="The object header (sizeof(struct ggml_object)), then the struct ggml_tensor and the "
                            "data, padded together to GGML_MEM_ALIGN.")


def view_cost(a) -> Exercise:
    """How much ``ggml_used_mem`` grows for ``ggml_transpose(ctx, a)`` (in a scratch context)."""
    scratch = ggml.init(1 << 16)
    like = ggml.new_tensor(scratch, a.type, 4, [int(x) for x in a.ne])
    before = ggml.used_mem(scratch)
    ggml.transpose(scratch, like)
    grew = ggml.used_mem(scratch) - before
    name = a.name or "a"
    return Exercise(f"`{name}` holds {ggml.nbytes(a)} bytes of data. By how many bytes does ggml_used_mem grow for "
                    f"ggml_transpose(ctx, {name})?", int(grew), unit="bytes",
                    explain="A view is a new object header and struct; its data pointer points into a's bytes.")


def graph_counts(out) -> Exercise:
    """(n_nodes, n_leafs) of the graph that ``ggml_build_forward_expand`` builds for ``out``."""
    scratch = ggml.init(ggml.graph_overhead() + (1 << 12), no_alloc=True)
    g = ggml.new_graph(scratch)
    ggml.build_forward_expand(g, out)
    return Exercise(f"ggml_build_forward_expand(gf, {out.name or 'out'}) walks the sources of "
                    f"{out.name or 'out'}. How many nodes and how many leafs will gf have (2 numbers)?",
                    (g.n_nodes, g.n_leafs),
                    explain="Tensors with an op (or that are parameters) become nodes, the others (no op) leafs; "
                            "the hash set makes a tensor used several times appear once.")


def layer_node_count(gf, layer: int = 0) -> Exercise:
    """How many nodes of ``gf`` belong to ``layer`` (by ggviz's layer-of-node rule: the -<il> suffix)."""
    n = sum(1 for il in G.node_layers(gf) if il == layer)
    return Exercise(f"The decode graph has {gf.n_nodes} nodes for {len({il for il in G.node_layers(gf) if il is not None})}"
                    f" layers. How many nodes does layer {layer} have?", int(n), unit="nodes",
                    explain="Every repeating layer builds the same sequence: attention norm, Q/K/V, RoPE, the KV "
                            "cache writes and views, KQ, softmax, KQV, output projection, residual, FFN norm, "
                            "gate/up/SwiGLU/down, residual.")


def gallocr_size_kib(gf, buft, no_reuse: int | None = None) -> Exercise:
    """The size of the buffer ``ggml_gallocr_reserve`` allocates for ``gf`` (a fresh gallocr; tensors untouched),
    in KiB, within 10 %."""
    ga = alloc.gallocr_new(buft)
    if not alloc.gallocr_reserve(ga, gf):
        raise RuntimeError("ggml_gallocr_reserve failed")
    kib = alloc.gallocr_get_buffer_size(ga, 0) / 1024.0
    base = f"Without reuse the graph's tensors need {no_reuse / 1024:.1f} KiB. " if no_reuse else ""
    return Exercise(base + "How big (KiB, within 10 %) is the buffer ggml_gallocr_reserve allocates for it?",
                    float(round(kib, 2)), rel_tol=0.10, unit="KiB",
                    explain="The high-water mark of the plan: a tensor's bytes are given back when its last "
                            "consumer is computed, and later tensors reuse them (in place where an op allows).")


def n_splits(view, ngl: int) -> Exercise:
    """The number of splits of a scheduled graph (a ``SchedulerView``'s)."""
    return Exercise(f"SmolLM2's 30 layers, -ngl {ngl}, one token: how many splits will ggml_backend_sched_split_graph "
                    f"make?", int(view.state()["n_splits"]), unit="splits",
                    explain="A split is a run of consecutive nodes on one backend; a new one starts wherever the "
                            "backend changes. The offloaded layers sit at the end of the stack.")


def chunk_thread(data: dict, node_name: str, chunk: int) -> Exercise:
    """Which thread computed chunk ``chunk`` of the MUL_MAT ``node_name`` in a recorded compute
    (``timeline.timeline_data``)."""
    who = [c["ith"] for c in data["chunks"] if c["name"] == node_name and c["chunk"] == chunk]
    if len(who) != 1:
        raise ValueError(f"chunk {chunk} of {node_name!r} was computed {len(who)} times in the recording")
    return Exercise(f"{data['n_threads']} threads compute {node_name}. Which thread computed its chunk {chunk}? "
                    f"(a thread index)", int(who[0]),
                    explain="Thread ith starts with chunk ith; every further chunk goes to whichever thread "
                            "increments the shared counter first (ggml_threadpool_chunk_add).")


def n_tasks(node, n_threads: int) -> Exercise:
    """``ggml_get_n_tasks(node, n_threads)``."""
    return Exercise(f"With {n_threads} threads, how many of them does ggml_get_n_tasks give the "
                    f"{ggml.op_desc(node).split(' ')[0]} node {node.name!r}?",
                    int(ggml_cpu.get_n_tasks(node, n_threads)), unit="threads",
                    explain="Views and reshapes compute nothing: 1. MUL_MAT, element-wise ops and norms: every "
                            "thread. SOFT_MAX: at most one thread per row (min(n_threads, rows)). The planner's n_tasks is what ggml_graph_plan counts; threads beyond it return "
                            "at once.")


def im2col_ne(kernel_ne, image_ne, s: int, p: int, d: int) -> Exercise:
    """ne of ``ggml_im2col`` (2-D, the same stride ``s``, padding ``p`` and dilation ``d`` on both axes) for a kernel
    and an image of these shapes (made in a scratch context)."""
    scratch = ggml.init(1 << 16, no_alloc=True)
    k = ggml.new_tensor(scratch, ggml.GGML_TYPE_F16, 4, [int(x) for x in kernel_ne])
    x = ggml.new_tensor(scratch, ggml.GGML_TYPE_F32, 4, [int(x) for x in image_ne])
    col = ggml.im2col(scratch, k, x, s, s, p, p, d, d, True, ggml.GGML_TYPE_F16)
    KW, KH, IC, _ = (int(v) for v in kernel_ne)
    IW, IH = int(image_ne[0]), int(image_ne[1])
    return Exercise(f"An image with ne = {list(image_ne)}, a kernel with ne = {list(kernel_ne)}, stride {s}, padding "
                    f"{p}, dilation {d} on both axes. What is the ne of ggml_im2col's result (4 numbers)?",
                    tuple(int(v) for v in col.ne), kind="rerun",
                    explain=f"ne[0] = IC·KH·KW = {IC}·{KH}·{KW}: a row holds every input value one output pixel "
                            f"reads. ne[1] = OW = (IW + 2p − d·(KW − 1) − 1)/s + 1 = ({IW} + {2 * p} − {d * (KW - 1)}"
                            f" − 1)/{s} + 1 (C's integer division), ne[2] = OH the same with IH = {IH}, KH; "
                            "ne[3] = N, the images.")
