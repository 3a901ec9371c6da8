"""ggviz.viz.widgets: interactive views (ipywidgets) of recorded ggml / llama.cpp runs.

Every widget is a plain object with ``state()`` (plain data of what is shown), action methods (``select``, ``step``,
``goto`` ...), a lazily built ``.widget`` (ipywidgets; Jupyter displays the object as it) and a static
``to_html()`` (and ``figure()`` where it is a matplotlib drawing) for reports.

- ``GGUFMapWidget``: a GGUF file as a byte map (header, KV pairs, tensor infos, padding, data); select a tensor.
- ``ArenaWidget``: a ggml context's arena; select an object -> its header fields decoded + hexdump.
- ``TensorExplorer``: ne/nb, index -> byte offset, the source bytes a view touches.
- ``QuantBlockExplorer``: one block of Q4_0/Q4_1/Q8_0/Q4_K/Q6_K: bytes -> scales, mins, quants -> values.
- ``GraphView``: the cgraph DAG, collapsible per layer; ``VisitAnimation``: ggml_visit_parents replayed.
- ``ThreadTimeline``: per-thread Gantt of one graph compute (nodes, mul_mat chunks, barrier waits).
- ``VecDotLanes``: one output element of a real Q4_1 MUL_MAT as ggml's AVX2 vec_dot computes it (8 lanes, FMAs,
  the horizontal reduce), bit for bit.
- ``FlashAttnStepper``: one query row of a real FLASH_ATTN_EXT node through the KV cells (running max, rescale, F16
  accumulator), ending on the node's output bits; ``AttnGraphsView``: the graph with flash attention beside the
  one without (a layer side by side, the KQ / softmax tensors only the latter allocates, both compute buffers).
- ``Exercise``: predict, then reveal: a question checked against a value computed from a real run.
- ``DecodeStepper``: one llama decode, node by node: DAG, values, memory.
- ``DecodeExplorer``: one decode step, every view linked to one selection (graph, bytes, thread lanes, scheduler cause,
  values), with llama_decode's call path as its spine.
- ``powerinfer``: PowerInfer's run (``PredictorView``, ``HotColdView``, ``SkippedRowsView``, ``HybridTimelineView``,
  ``SparseCostView``, fed by ``ggviz.capture``'s ``capture_sparse_run`` / ``hybrid_ffn_run``); imported as a submodule.
"""
from .arena import ArenaWidget  # noqa: F401
from .gguf import GGUFMapWidget  # noqa: F401
from .graph import GraphView, VisitAnimation  # noqa: F401
from .stepper import DecodeStepper  # noqa: F401
from .tensor import QuantBlockExplorer, TensorExplorer  # noqa: F401
from .timeline import ThreadTimeline  # noqa: F401
from .vecdot import VecDotLanes  # noqa: F401
from .flash_attn import AttnGraphsView, FlashAttnStepper  # noqa: F401
from .exercise import Exercise  # noqa: F401
from .alloc_view import AllocatorView  # noqa: F401,E402
from .sched_view import SchedulerView  # noqa: F401,E402
from .explorer import DecodeExplorer  # noqa: F401,E402
