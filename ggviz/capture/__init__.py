"""The one place that records a run, between the engine and the views (llama.cpp's ``common/debug.cpp`` and
``llama-eval-callback``, grown into a layer): it runs ``ggviz.llama`` / ``ggviz.ggml`` with ``ggviz.trace`` listening
and the eval callback copying, and keeps what it saw as plain records the views draw from.

- ``eval_callback``: ``EvalCallback(want, copy)``, the one ``cb_eval`` routine; ``NodeValue`` what it copies.
- ``graph``: ``capture_graph`` (``GraphRecord``: a cgraph's nodes, leafs, ops, names, shapes, sources -- what
  ``graph_dot`` / ``GraphView`` draw), ``GraphRecord.cgraph()`` (read back like a ``ggml_cgraph``).
- ``nodes``: ``layer_of(name)``, ``node_numbers(gf)`` (tensor address -> node number).
- ``decode``: ``decode_step`` (prompt, then one token, traced), ``record_decode`` (that step twice: with the values
  callback and without, numbered, checked), ``decode_graph``, ``new_context``, ``DEFAULT_PROMPT``.
- ``explorer``: ``record_step`` / ``capture_step`` (``StepRecord``: one decode step as the ``DecodeExplorer`` draws
  it: graph, split, plan, events, thread lanes, where each tensor's bytes are, inputs, values).
- ``inputs``: ``capture_inputs`` (``DecodeSnapshot``: the graph inputs and KV cells before each compute),
  ``capture_attention`` (``AttentionRecord``: every layer's ``kq_soft_max``).
- ``mul_mat``: ``capture_mul_mat`` (one MUL_MAT's weight rows, src1 and output, for the vec_dot lanes).
- ``flash_attn``: ``capture_flash_attn`` (``FlashAttnCapture``: one FLASH_ATTN_EXT node of a default-params decode),
  ``walk_flash_attn`` (``FlashAttnWalk``: one head's query row through the one-chunk kernel, cell by cell),
  ``capture_attn_graphs`` (``AttnGraphs``: the graphs with flash attention and without, side by side).
- ``sparse``: ``capture_sparse_run`` (``SparseRun``: a PWRI model's predictor, activations and skipped rows),
  ``hybrid_ffn_run`` (real layers through the hybrid executor: its records, outputs, transfers).
- ``plans``: ``capture_sched`` / ``record_sched_split`` (``SchedRecord``: the scheduler's passes, causes, splits and
  copies, replayed from the ``sched.*`` events), ``capture_alloc`` (``AllocRecord``: the allocator's per-tensor
  offsets, sizes, buffers, frees and in-place reuses) -- what ``SchedulerView`` and ``AllocatorView`` draw.
- ``stepper``: ``capture_stepper`` (``StepperRecord``: one decode, a frame per node with what was copied of its
  result, and the graph as a ``GraphRecord``) -- what ``DecodeStepper`` steps through.
- ``records``: ``save`` / ``load``: a record (dataclasses of numpy arrays, lists, dicts) to one ``.npz`` file and back.

Imports run one way: capture imports the engine (``ggviz.ggml``, ``ggviz.llama``, ``ggviz.trace``, ``ggviz.run``);
the views (``ggviz.viz``) and the commands (``ggviz.tools``) import capture; capture imports neither.
"""
from .decode import DEFAULT_PROMPT, DecodeStep, RecordedStep, decode_graph, decode_step, new_context, record_decode  # noqa: F401
from .eval_callback import EvalCallback, NodeValue, copy_f32, copy_raw, copy_value, installed  # noqa: F401
from .flash_attn import (  # noqa: F401
    AttnGraphs,
    FlashAttnCapture,
    FlashAttnWalk,
    capture_attn_graphs,
    capture_flash_attn,
    walk_flash_attn,
)
from .explorer import StepRecord, capture_step, record_step  # noqa: F401
from .graph import GraphRecord, RecordedGraph, as_cgraph, capture_graph  # noqa: F401
from .inputs import AttentionRecord, DecodeSnapshot, capture_attention, capture_inputs  # noqa: F401
from .mul_mat import capture_mul_mat  # noqa: F401
from .nodes import layer_of, node_numbers  # noqa: F401
from .plans import (AllocRecord, SchedRecord, capture_alloc, capture_sched,  # noqa: F401
                    record_sched_split)
from .records import load, save  # noqa: F401
from .stepper import StepperRecord, capture_stepper  # noqa: F401
from .sparse import SparseRun, capture_sparse_run, device_transfers, hybrid_ffn_run  # noqa: F401
