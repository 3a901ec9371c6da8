"""FLASH_ATTN_EXT compiled (fast path): ggml-cpu's one-chunk and tiled flash-attention kernels, operation for operation.

Not a ggml source file: like ``kernels.py`` it compiles ggml-cpu's kernels -- here ops.cpp's
``ggml_compute_forward_flash_attn_ext_f16_one_chunk`` and ``ggml_compute_forward_flash_attn_ext_tiled`` -- bit-identical
to the faithful NumPy kernels (``cpu/ops.py``, which document the arithmetic):

* one-chunk (fewer than GGML_FA_TILE_Q query rows: a decode step, a short prompt): Q rounded to fp16, one
  ``ggml_vec_dot_f16`` per unmasked KV cell, the online softmax with glibc's ``expf``, the F16 VKQ accumulator
  (``ggml_vec_scale_f16`` / ``ggml_vec_mad_f16``: float math, one FMA, rounded back to fp16), ``S = S*ms + vs``
  (one FMA in llama.cpp's build; ``cpu/ops.py``'s FA_S_FMA), then ``VKQ / S``;
* tiled (>= GGML_FA_TILE_Q query rows): per 64-cell KV tile, K·Q as a sequential FMA chain over DK from 0 (simd_gemm;
  8 cells' chains side by side in one vector),
  times scale, plus the mask; the tile max, the rescale of VKQ and S by ``expf(Mold - Mnew)``,
  ``ggml_vec_soft_max_f32`` (8-lane ``ggml_v_expf``, a double sum added to the float S), and softmax·V as a
  sequential FMA chain over the tile's cells (simd_gemm).

* split-KV (one query row over >= 512 cells): the one-chunk loop over ggml's per-thread KV chunks (ggml's thread
  count, written into the program before each compute: the merge's bits depend on it), partials in the work buffer,
  a barrier, the merge.

A query row's bits depend only on the kernel, so the rows are split over the threads that run the compiled walk
(ggml hands them out in chunks from a counter). ALiBi, the softcap, sinks and non-F16 K/V are not compiled:
``build_node`` returns False for them and the graph runs node by node on the faithful kernels.
"""
from __future__ import annotations

import numpy as np

from ... import consts as C
from ...tensor import get_op_params_f32, get_op_params_i32
from .. import cpu_feats
from .. import ops as cpu_ops
from ..common import FA_TILE_KV, FA_TILE_Q
from .intrinsics import (
    HAVE_AVX2,
    compiled,
    f16_to_f32_hw,
    f32_to_f16,
    fmaf,
    fp16_to_fp32,
    glibc_expf,
    kq_cells64,
    ld_f32,
    ld_u16,
    mad_f16_row,
    scale_f16_row,
    soft_max_exp8,
    soft_max_exp16,
    sv_cells_f16,
    st_f32,
)
from .program import (
    TRW_KERNEL,
    DATA,
    DST,
    FA_LANES,
    FA_MASK,
    FA_MNB1,
    FA_MNB2,
    FA_MNB3,
    FA_MNE2,
    FA_MNE3,
    FA_SCALE,
    FA_NTH,
    FA_SFMA,
    FA_SPLIT,
    NB1,
    NB2,
    NB3,
    NE0,
    NE1,
    NE2,
    NE3,
    OP,
    OP_FLASH_ATTN,
    S0,
    S1,
    S2,
)
from .rowdot import vec_dot_f16, vec_dot_f16_16
from .sync import traced, traced_barrier

F32 = np.float32
TQ, TKV = FA_TILE_Q, FA_TILE_KV


@compiled(inline="always")
def _h2f(h):
    """fp16 -> float: the F16C instruction where there is one (the tiled kernel widens every K and V value)."""
    if HAVE_AVX2:
        return f16_to_f32_hw(h)
    return fp16_to_fp32(h)


def build_node(P, F, k, node) -> bool:
    """Fill program row k for a FLASH_ATTN_EXT node, or False if the compiled kernel does not take it."""
    q, kk, v, mask = node.src[0], node.src[1], node.src[2], node.src[3]
    if node.src[4] is not None or q.type != C.GGML_TYPE_F32:
        return False
    if kk.type != C.GGML_TYPE_F16 or v.type != C.GGML_TYPE_F16 or node.type != C.GGML_TYPE_F32:
        return False
    if get_op_params_i32(node, 3) not in (C.GGML_PREC_DEFAULT, C.GGML_PREC_F32):
        return False
    if get_op_params_f32(node, 1) != 0.0 or get_op_params_f32(node, 2) != 0.0:      # ALiBi, softcap
        return False
    if int(q.nb[0]) != 4 or int(kk.nb[0]) != 2 or int(v.nb[0]) != 2 or int(node.nb[0]) != 4:
        return False
    # split-KV: its partials in the work buffer where ggml's kernel has them (the plan's work size holds them)
    P[k, FA_SPLIT] = 1 if (int(q.ne[1]) == 1 and int(q.ne[3]) == 1 and int(kk.ne[1]) >= 512) else 0
    if P[k, FA_SPLIT] and cpu_ops.FA_REDUCE_FMA != 1:
        return False
    if mask is not None:
        if mask.type != C.GGML_TYPE_F16 or int(mask.nb[0]) != 2 or not mask.data:
            return False
        P[k, FA_MASK] = mask.data
        P[k, FA_MNE2], P[k, FA_MNE3] = int(mask.ne[2]), int(mask.ne[3])
        P[k, FA_MNB1], P[k, FA_MNB2], P[k, FA_MNB3] = int(mask.nb[1]), int(mask.nb[2]), int(mask.nb[3])
    P[k, OP] = OP_FLASH_ATTN
    P[k, FA_SFMA] = 1 if cpu_ops.FA_S_FMA else 0
    P[k, FA_LANES] = cpu_feats.variant_lanes()
    F[k, FA_SCALE] = get_op_params_f32(node, 0)
    return True


@compiled
def _online(P, F, k, iq1, iq2, iq3, ic0, ic1, qq, acc):
    """The one-chunk kernel's loop for one query row over KV cells [ic0, ic1): acc (fp16 bits) and (M, S)."""
    q, kd, vd = P[k, S0 + DATA], P[k, S1 + DATA], P[k, S2 + DATA]
    DK, DV, neq2 = P[k, S1 + NE0], P[k, S2 + NE0], P[k, S0 + NE2]
    ik2 = iq2 // (neq2 // P[k, S1 + NE2])
    ik3 = iq3 // (P[k, S0 + NE3] // P[k, S1 + NE3])
    iv2 = iq2 // (neq2 // P[k, S2 + NE2])
    iv3 = iq3 // (P[k, S0 + NE3] // P[k, S2 + NE3])
    scale = F32(F[k, FA_SCALE])
    sfma = P[k, FA_SFMA] != 0
    mask = P[k, FA_MASK]
    mp = 0
    if mask != 0:
        mp = mask + iq1 * P[k, FA_MNB1] + (iq2 % P[k, FA_MNE2]) * P[k, FA_MNB2] + (iq3 % P[k, FA_MNE3]) * P[k, FA_MNB3]
    pq = q + iq1 * P[k, S0 + NB1] + iq2 * P[k, S0 + NB2] + iq3 * P[k, S0 + NB3]
    for d in range(DK):
        qq[d] = f32_to_f16(ld_f32(pq + 4 * d))
    for d in range(DV):
        acc[d] = 0
    S = F32(0.0)
    M = F32(-np.inf)
    kb = kd + ik2 * P[k, S1 + NB2] + ik3 * P[k, S1 + NB3]
    vb = vd + iv2 * P[k, S2 + NB2] + iv3 * P[k, S2 + NB3]
    nbk1, nbv1 = P[k, S1 + NB1], P[k, S2 + NB1]
    qa, aa = qq.ctypes.data, acc.ctypes.data
    # ggml_vec_scale_f16 / ggml_vec_mad_f16: GGML_F16_STEP (32) values at a time in F16C lanes, the rest one by one
    d8 = (DV // 32) * 4 if HAVE_AVX2 else 0
    for ic in range(ic0, ic1):
        mv = F32(0.0)
        if mp != 0:
            mv = fp16_to_fp32(ld_u16(mp + 2 * ic))
            if mv == F32(-np.inf):
                continue
        if P[k, FA_LANES] == 16:
            s = vec_dot_f16_16(DK, kb + ic * nbk1, qa)
        else:
            s = vec_dot_f16(DK, kb + ic * nbk1, qa)
        s = F32(s * scale)
        s = F32(s + mv)
        ms = F32(1.0)
        vs = F32(1.0)
        if s > M:
            Mold = M
            M = s
            ms = glibc_expf(F32(Mold - M))
            scale_f16_row(aa, 0, ms, d8)
            for d in range(8 * d8, DV):
                acc[d] = f32_to_f16(F32(fp16_to_fp32(acc[d]) * ms))
        else:
            vs = glibc_expf(F32(s - M))
        vrow = vb + ic * nbv1
        mad_f16_row(aa, vrow, vs, d8)
        for d in range(8 * d8, DV):
            acc[d] = f32_to_f16(fmaf(fp16_to_fp32(ld_u16(vrow + 2 * d)), vs, fp16_to_fp32(acc[d])))
        S = fmaf(S, ms, vs) if sfma else F32(F32(S * ms) + vs)
    return M, S


@compiled
def _one_row(P, F, k, iq1, iq2, iq3, qq, acc):
    DV, neq1, neq2 = P[k, S2 + NE0], P[k, S0 + NE1], P[k, S0 + NE2]
    M, S = _online(P, F, k, iq1, iq2, iq3, 0, P[k, S1 + NE1], qq, acc)
    s_inv = F32(0.0) if S == F32(0.0) else F32(F32(1.0) / S)
    ne1 = neq2
    out = P[k, DST + DATA] + (iq3 * neq1 * ne1 + iq2 + iq1 * ne1) * P[k, DST + NB1]
    for d in range(DV):
        st_f32(out + 4 * d, F32(fp16_to_fp32(acc[d]) * s_inv))


@compiled
def _split_kv(P, F, k, ith, nth, sync, wdata, qq, acc):
    """The split-KV kernel with ggml's thread count NTH (the program's FA_NTH): KV chunk c of every head into the
    partials (wdata, after NTH per-thread scratch rows of DK + 2*DV + 16 floats), chunks c = ith, ith + nth ... over
    the threads of this walk; a barrier; the merge of heads ith, ith + nth ... (gcc fuses the first product of
    ``VKQ_final*scale_old + VKQ_chunk*scale_new``)."""
    DK, DV, nek1, neq2 = P[k, S1 + NE0], P[k, S2 + NE0], P[k, S1 + NE1], P[k, S0 + NE2]
    NTH = max(P[k, FA_NTH], 1)
    chunk = (nek1 + NTH - 1) // NTH
    psize = 2 + DV
    parts = wdata + 4 * NTH * (DK + 2 * DV + 16)
    for c in range(ith, NTH, nth):
        ic0 = c * chunk
        for h in range(neq2):
            pp = parts + 4 * (h * NTH + c) * psize
            if ic0 < nek1:
                M, S = _online(P, F, k, 0, h, 0, ic0, min(ic0 + chunk, nek1), qq, acc)
                st_f32(pp, M)
                st_f32(pp + 4, S)
                for d in range(DV):
                    st_f32(pp + 8 + 4 * d, fp16_to_fp32(acc[d]))
            else:
                st_f32(pp, F32(-np.inf))
                st_f32(pp + 4, F32(0.0))
    traced_barrier(sync, nth, ith, k, TRW_KERNEL, traced(sync))
    vk = np.empty(DV, np.float32)
    out0 = P[k, DST + DATA]
    for h in range(ith, neq2, nth):
        Mf = F32(-np.inf)
        Sf = F32(0.0)
        for d in range(DV):
            vk[d] = F32(0.0)
        for c in range(NTH):
            if c * chunk >= nek1:
                continue
            pp = parts + 4 * (h * NTH + c) * psize
            Mc, Sc = ld_f32(pp), ld_f32(pp + 4)
            if Sc == F32(0.0):
                continue
            Mn = Mf if Mf > Mc else Mc
            so = glibc_expf(F32(Mf - Mn))
            sn = glibc_expf(F32(Mc - Mn))
            for d in range(DV):
                vk[d] = fmaf(vk[d], so, F32(ld_f32(pp + 8 + 4 * d) * sn))
            Sf = fmaf(Sf, so, F32(Sc * sn))
            Mf = Mn
        if Sf != F32(0.0):
            inv = F32(F32(1.0) / Sf)
            for d in range(DV):
                vk[d] = F32(vk[d] * inv)
        out = out0 + h * P[k, DST + NB1]
        for d in range(DV):
            st_f32(out + 4 * d, vk[d])


@compiled
def _tiled_rows(P, F, k, iq1a, iq1b, iq2, iq3, kq, kt, vkq, mvs, Ms, Ss):
    """Query rows iq1a..iq1b-1 (at most TQ) of head (iq2, iq3), tile after tile of KV cells as
    ggml_compute_forward_flash_attn_ext_tiled walks them: each KV tile's K is widened to float32 and packed
    transposed once for the rows (K_f32), each row's K·Q and softmax·V then run on vectors of cells / dims. A row's
    arithmetic is its own (its FMA chains, its online softmax state Ms/Ss/vkq), the same whatever rows share a tile."""
    q, kd, vd, dst = P[k, S0 + DATA], P[k, S1 + DATA], P[k, S2 + DATA], P[k, DST + DATA]
    DK, nek1, DV = P[k, S1 + NE0], P[k, S1 + NE1], P[k, S2 + NE0]
    neq1, neq2 = P[k, S0 + NE1], P[k, S0 + NE2]
    ik2 = iq2 // (neq2 // P[k, S1 + NE2])
    ik3 = iq3 // (P[k, S0 + NE3] // P[k, S1 + NE3])
    iv2 = iq2 // (neq2 // P[k, S2 + NE2])
    iv3 = iq3 // (P[k, S0 + NE3] // P[k, S2 + NE3])
    scale = F32(F[k, FA_SCALE])
    mask = P[k, FA_MASK]
    kb = kd + ik2 * P[k, S1 + NB2] + ik3 * P[k, S1 + NB3]
    vb = vd + iv2 * P[k, S2 + NB2] + iv3 * P[k, S2 + NB3]
    nbk1, nbv1 = P[k, S1 + NB1], P[k, S2 + NB1]
    nrows = iq1b - iq1a
    vec = HAVE_AVX2 and TKV == 64
    for i in range(nrows * DV):
        vkq[i] = F32(0.0)
    for r in range(nrows):
        Ss[r] = F32(0.0)
        Ms[r] = F32(-np.inf)
    d8 = DV // 8 if HAVE_AVX2 else 0
    for ic in range(0, nek1, TKV):
        kv = min(TKV, nek1 - ic)
        packed = False
        for r in range(nrows):
            iq1 = iq1a + r
            mp = 0
            if mask != 0:
                mp = (mask + iq1 * P[k, FA_MNB1] + (iq2 % P[k, FA_MNE2]) * P[k, FA_MNB2]
                      + (iq3 % P[k, FA_MNE3]) * P[k, FA_MNB3])
            pq = q + iq1 * P[k, S0 + NB1] + iq2 * P[k, S0 + NB2] + iq3 * P[k, S0 + NB3]
            # the mask of the tile's cells first (-inf: out of the tile or masked); a tile with none left is skipped
            live = False
            for c in range(TKV):
                mv = F32(-np.inf)
                if c < kv:
                    mv = fp16_to_fp32(ld_u16(mp + 2 * (ic + c))) if mp != 0 else F32(0.0)
                mvs[c] = mv
                live = live or mv != F32(-np.inf)
            if not live:
                continue
            # K·Q: each cell's sum is its own FMA chain over d from 0 (simd_gemm's order)
            if vec:
                if not packed:
                    # the tile's K widened and transposed (K_f32[d][c]), the cells past the tile zero
                    for c in range(TKV):
                        krow = kb + (ic + c) * nbk1
                        if c < kv:
                            for d in range(DK):
                                kt[d * TKV + c] = _h2f(ld_u16(krow + 2 * d))
                        else:
                            for d in range(DK):
                                kt[d * TKV + c] = F32(0.0)
                    packed = True
                kq_cells64(kq.ctypes.data, kt.ctypes.data, pq, DK)
            else:
                for c in range(TKV):
                    kq[c] = F32(0.0)
                for d in range(DK):
                    qd = ld_f32(pq + 4 * d)
                    kcol = kb + ic * nbk1 + 2 * d
                    for c in range(kv):
                        kq[c] = fmaf(_h2f(ld_u16(kcol + c * nbk1)), qd, kq[c])
            tmax = F32(-np.inf)
            for c in range(TKV):
                if mvs[c] == F32(-np.inf):
                    kq[c] = F32(-np.inf)
                    continue
                a = F32(kq[c] * scale)
                if mp != 0:
                    a = F32(a + mvs[c])
                kq[c] = a
                tmax = tmax if tmax > a else a
            if tmax == F32(-np.inf):
                continue
            M, S = Ms[r], Ss[r]
            vr = r * DV
            mnew = M if M > tmax else tmax
            if mnew > M:
                ms = glibc_expf(F32(M - mnew))
                for d in range(DV):
                    vkq[vr + d] = F32(vkq[vr + d] * ms)
                S = F32(S * ms)
            M = mnew
            if P[k, FA_LANES] == 16:
                ssum = soft_max_exp16(kq.ctypes.data, kq.ctypes.data, TKV // 16, M)
            else:
                ssum = soft_max_exp8(kq.ctypes.data, kq.ctypes.data, TKV // 8, M)
            Ss[r] = F32(np.float64(S) + ssum)
            Ms[r] = M
            # softmax·V: each dim's FMA chain over the cells in order (simd_gemm's)
            if d8 > 0:
                sv_cells_f16(vkq.ctypes.data + 4 * vr, vb + ic * nbv1, nbv1, kq.ctypes.data, kv, d8)
            for c in range(kv):
                w = kq[c]
                vrow = vb + (ic + c) * nbv1
                for d in range(8 * d8, DV):
                    vkq[vr + d] = fmaf(_h2f(ld_u16(vrow + 2 * d)), w, vkq[vr + d])
    ne1 = neq2
    for r in range(nrows):
        S = Ss[r]
        s_inv = F32(0.0) if S == F32(0.0) else F32(F32(1.0) / S)
        out = dst + (iq3 * neq1 * ne1 + iq2 + (iq1a + r) * ne1) * P[k, DST + NB1]
        for d in range(DV):
            st_f32(out + 4 * d, F32(vkq[r * DV + d] * s_inv))


@compiled
def k_flash_attn_ext(P, F, k, ith, nth, sync, wdata):
    neq1, neq2, neq3 = P[k, S0 + NE1], P[k, S0 + NE2], P[k, S0 + NE3]
    nr = neq1 * neq2 * neq3
    dr = (nr + nth - 1) // nth
    ir0 = dr * ith
    ir1 = min(ir0 + dr, nr)
    tiled = neq1 >= TQ
    DK, DV = P[k, S1 + NE0], P[k, S2 + NE0]
    qq = np.empty(DK, np.uint16)
    acc = np.empty(DV, np.uint16)
    kq = np.empty(TKV, np.float32)
    mvs = np.empty(TKV, np.float32)
    if P[k, FA_SPLIT] != 0:
        _split_kv(P, F, k, ith, nth, sync, wdata, qq, acc)
        return
    if tiled:
        # up to TQ rows of one head at a time (ggml's Q tile), so that a KV tile is widened once for them
        kt = np.empty(DK * TKV, np.float32)
        vkq = np.empty(TQ * DV, np.float32)
        Ms = np.empty(TQ, np.float32)
        Ss = np.empty(TQ, np.float32)
        ir = ir0
        while ir < ir1:
            iq3 = ir // (neq2 * neq1)
            iq2 = (ir - iq3 * neq2 * neq1) // neq1
            iq1 = ir - iq3 * neq2 * neq1 - iq2 * neq1
            n = min(TQ, ir1 - ir, neq1 - iq1)
            _tiled_rows(P, F, k, iq1, iq1 + n, iq2, iq3, kq, kt, vkq, mvs, Ms, Ss)
            ir += n
        return
    for ir in range(ir0, ir1):
        iq3 = ir // (neq2 * neq1)
        iq2 = (ir - iq3 * neq2 * neq1) // neq1
        iq1 = ir - iq3 * neq2 * neq1 - iq2 * neq1
        _one_row(P, F, k, iq1, iq2, iq3, qq, acc)
