"""The compiled kernels Gemma-3's graph adds to the fast path (ggviz/ggml/cpu/fast/gemma_ops.py): SCALE and GEGLU,
bit-exact with the faithful kernels (which are bit-exact with the real ggml: tests/test_gemma3.py and
tests/test_cpu_ops.py), for 1 and 2 threads, at Gemma-3 270M's shapes (n_embd 640, 4 heads of 256, ffn 2048) and
with a tail / odd row count."""
from __future__ import annotations

import numpy as np
import pytest

from ggviz import ggml
from ggviz.ggml import consts as C

pytest.importorskip("ggviz.ggml.cpu.fast.kernels", reason="the compiled fast path needs Numba")
from tests.test_fast_path import _check, _f32, _run_both  # noqa: E402 - after the importorskip


@pytest.mark.parametrize("shape,s,b", [((640, 1), float(np.sqrt(np.float32(640))), 0.0),
                                       ((256, 4, 7), 0.0625, 0.0),
                                       ((37, 5), 1.7, -0.3)], ids=["inp_scaled", "q_scale", "scale_bias"])
def test_scale(shape, s, b):
    def build(ctx, rng):
        a = _f32(ctx, rng, *shape, scale=20.0)
        return ggml.scale(ctx, a, s) if b == 0.0 else ggml.scale_bias(ctx, a, s, b)
    _check(_run_both(build))


@pytest.mark.parametrize("variant", ["split", "fused", "swapped"])
@pytest.mark.parametrize("n", [2048, 27])
def test_geglu(variant, n):
    def build(ctx, rng):
        # scale 6: many values beyond +-10 too (the two clamped branches), most through the fp16 table
        if variant == "split":
            return ggml.geglu_split(ctx, _f32(ctx, rng, n, 3, scale=6.0), _f32(ctx, rng, n, 3))
        a = _f32(ctx, rng, 2 * n, 3, scale=6.0)
        return ggml.glu(ctx, a, C.GGML_GLU_OP_GEGLU, variant == "swapped")
    _check(_run_both(build))


def test_qk_norm_and_neox_rope_at_gemma_shapes():
    """The QK norm (RMS_NORM of [256, 4] heads fused with the MUL by a [256] weight) and NEOX RoPE of 256 dims with
    the global (1e6) and the sliding-window (1e4) base: the existing compiled kernels at Gemma-3's shapes, bit-exact
    with the faithful ones. (With these and SCALE / GEGLU, only the Q5_0 / Q4_K / Q6_K MUL_MATs keep Gemma-3's
    decode graph off the compiled walk.)"""
    def norm(ctx, rng):
        return ggml.mul(ctx, ggml.rms_norm(ctx, _f32(ctx, rng, 256, 4, 3, scale=4.0), 1e-6), _f32(ctx, rng, 256))
    _check(_run_both(norm))
    for base in (1e6, 1e4):
        def rope(ctx, rng, b=base):
            pos = ggml.new_tensor_1d(ctx, C.GGML_TYPE_I32, 3)
            ggml.get_data(pos)[...] = np.array([0, 300, 1000], np.int32).reshape(ggml.get_data(pos).shape)
            return ggml.rope_ext(ctx, _f32(ctx, rng, 256, 4, 3), pos, None, 256, ggml.GGML_ROPE_TYPE_NEOX, 32768,
                                 b, 1.0, 0.0, 1.0, 32.0, 1.0)
        _check(_run_both(rope))
