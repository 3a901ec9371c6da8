"""ggviz.viz: figures and tables drawn from the engine's objects (ggviz.ggml) and trace recordings (ggviz.trace).

The engine never imports this package; this package only reads what the engine built.

- ``arena``: ``arena_map``, ``objects_table``, ``plot_arena``, ``hexdump``, ``tensor_header_table``
- ``graph_dot``: ``graph_to_dot``, ``render``
- ``tensor``: ``strides_table``, ``element_offset``, ``q4_0_block_figure``, ``im2col_figure``
"""
from .arena import arena_map, hexdump, objects_table, plot_arena, tensor_header_table  # noqa: F401
from .graph_dot import graph_to_dot, render  # noqa: F401
from .table import Table  # noqa: F401
from .tensor import element_offset, im2col_figure, q4_0_block_figure, strides_table  # noqa: F401
