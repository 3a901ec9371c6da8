"""The neuron placement solver and the ``.generated.gpuidx`` file.

Mirrors SJTU-IPADS/PowerInfer's ``powerinfer-py/powerinfer/solver.py`` (``solve_gpu_split``) and
``export_split.py``, and the solver parameters of llama.cpp's ``llm_load_gpu_split_with_budget``:

* ``slice_size = ffn_up->ne[1] * type_size / blck_size``; ``neuron_cap = floor(budget / (slice_size * 4.5)) * 4``
  (4.5 with a gate matrix, 2 without; PowerInfer's own comment: "TODO: why 4.5, not 3?");
* per layer the activation counts are sorted (hottest first) and summed in buckets of ``batch`` = 256 neurons;
  the ILP maximises the activations covered, sum over buckets of count * x, with sum(x) <= neuron_cap / 256 and,
  with PowerInfer's default threshold 0, no per-layer minimum. Its bucket values fall within a layer, so the
  optimum is the globally hottest buckets: each layer gets a prefix of its sorted buckets. ``solve_gpu_split``
  takes them greedily (cvxopt/GLPK is not a dependency of ggviz; tests/test_powerinfer_model.py writes
  PowerInfer's ILP, constraints and all, for scipy's MILP (HiGHS) and checks the greedy optimum against it on the
  build's activation counts);
* ``export_split``: per layer the ``k`` hottest neurons (k = the layer's solved count, a multiple of 256) become
  ``blk.N.gpu_idx`` (I32 0/1, [n_ff]) and ``blk.N.gpu_bucket`` (their sorted indices, I32), in a GGUF of
  architecture ``generic.gpu_index`` with ``split.vram_capacity`` (u64), its magic then patched to ``PWRI`` v3.
"""
from __future__ import annotations

import math
import os
import pathlib

import gguf
import numpy as np

from .. import ggml
from ..llama import powerinfer as lpi

BATCH = 256


def neuron_cap(budget_bytes: int, ffn_up, has_gate: bool = True) -> int:
    """llm_load_gpu_split_with_budget's solver capacity (``budget_bytes``: finite, >= 0)."""
    if not (isinstance(budget_bytes, (int, np.integer, float)) and math.isfinite(budget_bytes) and budget_bytes >= 0):
        raise ValueError(f"neuron_cap: budget_bytes = {budget_bytes!r} must be a finite number of bytes >= 0")
    slice_size = int(ffn_up.ne[1]) * ggml.type_size(ffn_up.type) // ggml.blck_size(ffn_up.type)
    per_slice = slice_size * (4.5 if has_gate else 2)
    return int(math.floor(budget_bytes / per_slice)) * 4


def solve_gpu_split(counts: np.ndarray, capacity: int, batch: int = BATCH) -> list[int]:
    """Hot neurons per layer (multiples of ``batch``, total <= capacity) maximising the activations covered."""
    counts = np.asarray(counts, np.float64)
    if counts.ndim != 2 or not np.isfinite(counts).all() or (counts < 0).any():
        raise ValueError(f"solve_gpu_split: counts must be a (layers, n_ff) array of finite counts >= 0 "
                         f"(shape {counts.shape})")
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 0:
        raise ValueError(f"solve_gpu_split: capacity = {capacity!r} must be an integer >= 0 (neurons)")
    n_layer, n_ff = counts.shape
    if n_ff % batch:
        raise ValueError(f"n_ff = {n_ff} is not a multiple of the bucket size {batch}")
    vals = -np.sort(-counts, axis=1).reshape(n_layer, n_ff // batch, batch).sum(2)     # (layer, bucket)
    cap = max(int(capacity) // batch, 0)
    flat = vals.reshape(-1)
    # the hottest buckets globally; ties broken by (layer, bucket) order, which keeps per-layer prefixes
    order = np.lexsort((np.arange(flat.size), -flat))[:cap]
    take = np.zeros(flat.size, bool)
    take[order] = True
    return [int(k) * batch for k in take.reshape(n_layer, -1).sum(1)]


def gpu_index(counts: np.ndarray, solved: list[int]) -> list[np.ndarray]:
    """export_split's per-layer gpu_idx: 1 on the layer's ``solved[i]`` most active neurons (torch.topk)."""
    out = []
    for c, k in zip(np.asarray(counts), solved):
        idx = np.zeros(c.shape[0], np.int32)
        if k:
            idx[np.argsort(-c, kind="stable")[:k]] = 1
        out.append(idx)
    return out


def export_split(path, gpu_idx: list, vram_capacity: int) -> None:
    w = gguf.GGUFWriter(os.fspath(path), "generic.gpu_index")
    for il, gi in enumerate(gpu_idx):
        gi = np.asarray(gi, np.int32)
        w.add_tensor(f"blk.{il}.gpu_idx", gi, raw_dtype=gguf.GGMLQuantizationType.I32)
        bucket = np.flatnonzero(gi).astype(np.int32)
        w.add_tensor(f"blk.{il}.gpu_bucket", bucket, raw_dtype=gguf.GGMLQuantizationType.I32)
    w.add_block_count(len(gpu_idx))
    w.add_uint64("split.vram_capacity", int(vram_capacity))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(path, "r+b") as f:
        f.write(b"PWRI")
        f.write((3).to_bytes(4, "little"))


def write_gpuidx(model_path, counts: np.ndarray, neuron_bytes: int, ffn_up, vram_capacity: int) -> tuple:
    """Solve for ``neuron_bytes`` of FFN neurons (what the VRAM budget leaves after PowerInfer's first offload
    steps, ``ggviz.llama.powerinfer.offload_plan``) and write ``<model>.generated.gpuidx`` next to the model.
    Returns (path, neuron_cap, solved per-layer counts)."""
    cap = neuron_cap(int(neuron_bytes), ffn_up)
    solved = solve_gpu_split(counts, cap)
    path = pathlib.Path(os.fspath(model_path) + ".generated.gpuidx")
    export_split(path, gpu_index(counts, solved), int(vram_capacity))
    return path, cap, solved


def read_gpuidx(path) -> list[np.ndarray]:
    """The per-layer gpu_idx of a .generated.gpuidx file, checked (its gpu_bucket, the values 0/1, the layers: see
    ``ggviz.llama.powerinfer.read_split_file``). Read through a read-only mapping: nothing is written anywhere, so
    an index in a read-only folder reads as any other."""
    return lpi.read_split_file(path)[0]
