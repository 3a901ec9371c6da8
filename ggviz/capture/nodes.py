"""Node numbering: which layer a tensor belongs to (from the names llama.cpp's graph callback gives), and which node
of a cgraph a tensor the eval callback saw is (its address -> its index in ``gf.nodes``).

llama.cpp names a layer's tensors ``<name>-<il>`` (``llm_graph_context::cb``), its KV cache views ``cache_k_l<il>``
and its weights ``blk.<il>.*`` (llama-arch.cpp); ggml numbers a graph's nodes by their order in ``cgraph->nodes``,
which is what ``ggml_graph_print`` and the eval callback's ``ggml_graph_node(gf, i)`` use.
"""
from __future__ import annotations

import re

_LAYER_SUFFIX = re.compile(r"-(\d+)(?=$|\s)")            # "Qcur-3", "Kcur-3 (view)"
_CACHE_LAYER = re.compile(r"^cache_[kv]_l(\d+)(?=$|\s)")  # "cache_k_l3 (view)": llama_kv_cache's names
_WEIGHT_LAYER = re.compile(r"^blk\.(\d+)\.")              # "blk.3.attn_q.weight"


def layer_of(name: str):
    """The layer index in a tensor name (``Qcur-3``, ``cache_k_l3 (view)``, ``blk.3.ffn_up.weight``), or None."""
    for rx in (_LAYER_SUFFIX, _CACHE_LAYER, _WEIGHT_LAYER):
        m = rx.search(name) if rx is _LAYER_SUFFIX else rx.match(name)
        if m:
            return int(m.group(1))
    return None


def node_numbers(gf) -> dict:
    """``{tensor address: node number}`` of the cgraph ``gf``: the eval callback hands out tensors, the views
    number nodes as ``gf.nodes`` does. (A tensor's ``addr`` is its identity, stable for the run.)"""
    return {t.addr: i for i, t in enumerate(gf.nodes)}
