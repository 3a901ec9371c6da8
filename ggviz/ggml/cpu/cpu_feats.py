"""cpu-feats.cpp: which of ggml's x86 CPU variants this machine would run, and the one ggviz computes as.

Mirrors (ggml 0.25.3, as vendored by llama-cpp-python 0.3.36):
- ``ggml/src/CMakeLists.txt``'s ``GGML_CPU_ALL_VARIANTS`` list for x86 (``ggml_add_cpu_backend_variant``): each
  variant is one ``libggml-cpu-<tag>.so`` compiled with its own ``GGML_<FEAT>`` definitions and ``-m`` flags;
- ``ggml/src/ggml-cpu/arch/x86/cpu-feats.cpp``: ``struct cpuid_x86`` (the CPUID bits) and
  ``ggml_backend_cpu_x86_score``, the score each variant library exports as ``ggml_backend_score``: 0 when the
  machine lacks a feature the variant was compiled for, otherwise a sum of one bit per feature;
- ``ggml-backend-reg.cpp: ggml_backend_load_best``: the loader keeps the library with the highest score (strictly
  higher: the first one found wins a tie);
- ``ggml-cpu.cpp: ggml_backend_cpu_get_features``: the compile-time features a build reports (what
  ``llama_print_system_info`` prints after "CPU : ").

ggviz computes as one variant, ``haswell`` (AVX/AVX2/FMA/F16C/BMI2: the build whose bits it reproduces) unless
``GGVIZ_CPU_VARIANT`` names another, whatever the machine: its kernels are Python and Numba, so the variant is a
choice of *which C build's arithmetic* to reproduce (vector widths, reduction trees), not of which instructions this
machine may run. ``zen4`` (AVX-512) is implemented where it is checked against a stored AVX-512 capture
(``ZEN4_KERNELS`` says which kernels, and which differ from AVX2 without a capture to check them).
"""
from __future__ import annotations

import os

# CPUID bit -> its name in Linux's /proc/cpuinfo "flags" line. ggml reads CPUID itself; Python cannot execute
# CPUID, and the kernel's flags are the same bits (cleared where the OS does not enable the state, which ggml's
# FIXME "this does not check for OS support" leaves to chance).
_CPUINFO_FLAG = {
    "SSE3": "pni", "SSSE3": "ssse3", "FMA": "fma", "SSE42": "sse4_2", "AVX": "avx", "F16C": "f16c",
    "AVX2": "avx2", "BMI2": "bmi2", "AVX_VNNI": "avx_vnni",
    "AVX512F": "avx512f", "AVX512CD": "avx512cd", "AVX512VL": "avx512vl", "AVX512DQ": "avx512dq",
    "AVX512BW": "avx512bw", "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16", "AMX_TILE": "amx_tile", "AMX_INT8": "amx_int8",
}

# ggml/src/CMakeLists.txt, GGML_CPU_ALL_VARIANTS on x86 (non-MSVC), in the file's order: tag -> GGML_<FEAT> defined
CPU_VARIANTS_X86 = {
    "x64":            (),
    "sse42":          ("SSE42",),
    "sandybridge":    ("SSE42", "AVX"),
    "ivybridge":      ("SSE42", "AVX", "F16C"),
    "piledriver":     ("SSE42", "AVX", "F16C", "FMA"),
    "haswell":        ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2"),
    "skylakex":       ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512"),
    "cannonlake":     ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI"),
    "cascadelake":    ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VNNI"),
    "icelake":        ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI"),
    "cooperlake":     ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VNNI", "AVX512_BF16"),
    "zen4":           ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI",
                       "AVX512_BF16"),
    "alderlake":      ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX_VNNI"),
    "sapphirerapids": ("SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "AVX512", "AVX512_VBMI", "AVX512_VNNI",
                       "AVX512_BF16", "AMX_TILE", "AMX_INT8"),
}

# the variants whose arithmetic ggviz reproduces (GGVIZ_CPU_VARIANT may name these)
IMPLEMENTED_VARIANTS = ("haswell", "zen4")
DEFAULT_VARIANT = "haswell"

# The kernels whose bits an AVX-512 build (the zen4 variant) computes differently from AVX2 (read in ggml-cpu's
# vec.h / vec.cpp / simd-mappings.h / ops.cpp / arch/x86/quants.c / repack.cpp / llamafile/sgemm.cpp), with
# ggviz's status under GGVIZ_CPU_VARIANT=zen4:
#   "verified":    implemented (faithful and compiled), bit-identical to the stored AVX-512 capture
#                  (tests/test_cpu_variant.py);
#   "unverified":  implemented (faithful and compiled) as the C reads; no stored AVX-512 capture exercises it;
#   "haswell":     not implemented: ggviz computes the AVX2 build's bits there.
# The kernels whose AVX-512 code computes the same bits as AVX2 are listed in docs/cpu-variants.md.
ZEN4_KERNELS = {
    "ggml_v_expf / ggml_vec_soft_max_f32": (
        "verified", "16 lanes; the polynomial keeps its 1 and 2^n is vscalefps (one rounding), not fma(j, k, k); "
        "_mm512_reduce_add_ps per block; tail n % 16 to libm expf"),
    "ggml_v_silu / ggml_vec_swiglu_f32 / ggml_vec_silu_f32": (
        "verified", "16-lane ggml_v_expf (above); tail n % 16 to libm expf"),
    "tinyBLAS float kernel (F16/F32 MUL_MAT, n >= 2)": (
        "verified", "tinyBLAS<16, __m512>: one 16-lane FMA accumulator per element, _mm512_reduce_add_ps; refuses "
        "k % 16; VECTOR_REGISTERS 32 tiles (mnpack<4, 6, BM>, BN 12)"),
    "ggml_vec_dot_f16 (decode K·Q and softmax·V, FA one-chunk)": (
        "unverified", "GGML_F16_STEP 64: 4 accumulators x 16 lanes, GGML_F32x16_REDUCE, n % 64 leftovers in double"),
    "ggml_vec_cvar_f32 (NORM)": (
        "unverified", "_mm512_reduce_add_ps of 16 squares per block added to the double sum"),
    "flash attention, tiled kernel's softmax": (
        "unverified", "ggml_vec_soft_max_f32 over each 64-cell tile in 16-lane blocks"),
    "ggml_vec_dot_f32": (
        "haswell", "4 x 16 lanes and GGML_F32x16_REDUCE, but its float leftover loop is compiler-vectorised: "
                   "needs the AVX-512 build's disassembly (no F32 MUL_MAT in SmolLM2 / Gemma-3 graphs)"),
    "int8 pair sums with VNNI (tinyBLAS_Q0 updot, mul_sum_i8_pairs_float)": (
        "haswell", "vpdpbusd instead of maddubs + madd: no int16 saturation, which differs only where a -128 byte "
                   "meets a -128 byte (ggml's Q8 quantizers never write -128)"),
    "ggml_vec_dot_bf16": (
        "haswell", "AVX512_BF16 vdpbf16ps (its own rounding) in 2 accumulators of 16 lanes (no BF16 tensors here)"),
}


class CpuVariantError(ValueError):
    """GGVIZ_CPU_VARIANT names no variant, or one whose kernels ggviz does not have."""


class cpuid_x86:
    """``struct cpuid_x86``: the feature bits ggml's score reads, from /proc/cpuinfo's flags (or a given set)."""

    def __init__(self, flags: set[str] | None = None):
        self.flags = _cpuinfo_flags() if flags is None else set(flags)

    def has(self, feat: str) -> bool:
        return _CPUINFO_FLAG[feat] in self.flags


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()       # not Linux/x86: every variant but x64 scores 0, as on a CPU without the features


# (GGML_<FEAT> definition, the CPUID features it requires, its score bit) in cpu-feats.cpp's order
_SCORE = (
    ("FMA", ("FMA",), 1 << 0),
    ("F16C", ("F16C",), 1 << 1),
    ("SSE42", ("SSE42",), 1 << 2),
    ("BMI2", ("BMI2",), 1 << 3),
    ("AVX", ("AVX",), 1 << 4),
    ("AVX2", ("AVX2",), 1 << 5),
    ("AVX_VNNI", ("AVX_VNNI",), 1 << 6),
    ("AVX512", ("AVX512F", "AVX512CD", "AVX512VL", "AVX512DQ", "AVX512BW"), 1 << 7),
    ("AVX512_VBMI", ("AVX512_VBMI",), 1 << 8),
    ("AVX512_BF16", ("AVX512_BF16",), 1 << 9),
    ("AVX512_VNNI", ("AVX512_VNNI",), 1 << 10),
    ("AMX_INT8", ("AMX_INT8",), 1 << 11),
)


def ggml_backend_cpu_x86_score(variant: str, cpu: cpuid_x86 | None = None) -> int:
    """The ``ggml_backend_score`` that ``libggml-cpu-<variant>.so`` returns on this machine (or on ``cpu``)."""
    defs = CPU_VARIANTS_X86[variant]
    cpu = cpu or cpuid_x86()
    score = 1
    for define, needs, bit in _SCORE:
        if define in defs:
            if not all(cpu.has(f) for f in needs):
                return 0
            score += bit
    return score


def ggml_backend_load_best(cpu: cpuid_x86 | None = None) -> tuple[str, int]:
    """The variant ``ggml_backend_load_best("cpu")`` would load here, and its score (a strictly higher score wins)."""
    cpu = cpu or cpuid_x86()
    best, best_score = "", 0
    for tag in CPU_VARIANTS_X86:
        s = ggml_backend_cpu_x86_score(tag, cpu)
        if s > best_score:
            best, best_score = tag, s
    return best, best_score


def variant_features(variant: str) -> list[str]:
    """``ggml_backend_cpu_get_features``' x86 entries for a build of ``variant``: the compiler macros its ``-m``
    flags define (``-msse4.2`` implies SSE3/SSSE3; ``-mavx512f`` is reported as AVX512), in the C's order."""
    defs = set(CPU_VARIANTS_X86[variant])
    if "SSE42" in defs:
        defs |= {"SSE3", "SSSE3"}
    order = ("SSE3", "SSSE3", "AVX", "AVX_VNNI", "AVX2", "F16C", "FMA", "BMI2", "AVX512", "AVX512_VBMI",
             "AVX512_VNNI", "AVX512_BF16", "AMX_INT8")
    return [f for f in order if f in defs]


def variant_lanes(variant: str | None = None) -> int:
    """Floats per SIMD register in vec.h / vec.cpp's loops (``__m512`` 16 when the build defines AVX512F,
    ``__m256`` 8 otherwise) for ``variant`` (default: the one ggviz computes as)."""
    return 16 if "AVX512" in CPU_VARIANTS_X86[variant or cpu_variant()] else 8


def variant_warning(variant: str) -> str:
    """One line naming the kernels where ggviz's ``variant`` is not checked bit for bit ('' when all are)."""
    if variant != "zen4":
        return ""
    unverified = [k for k, (st, _) in ZEN4_KERNELS.items() if st == "unverified"]
    haswell = [k for k, (st, _) in ZEN4_KERNELS.items() if st == "haswell"]
    parts = []
    if haswell:
        parts.append("computed as haswell: " + "; ".join(haswell))
    if unverified:
        parts.append("implemented but unverified: " + "; ".join(unverified))
    return ("GGVIZ_CPU_VARIANT=zen4 reproduces the AVX-512 build only where a capture checked it; "
            + " | ".join(parts)) if parts else ""


def cpu_variant() -> str:
    """The variant ggviz computes as: ``GGVIZ_CPU_VARIANT`` (default ``haswell``), checked."""
    name = os.environ.get("GGVIZ_CPU_VARIANT", "").strip() or DEFAULT_VARIANT
    if name not in CPU_VARIANTS_X86:
        raise CpuVariantError(f"GGVIZ_CPU_VARIANT={name!r} is not one of ggml's x86 CPU variants "
                         f"({', '.join(CPU_VARIANTS_X86)})")
    if name not in IMPLEMENTED_VARIANTS:
        raise CpuVariantError(f"GGVIZ_CPU_VARIANT={name!r}: ggviz reproduces only the {', '.join(IMPLEMENTED_VARIANTS)} "
                         f"build's arithmetic; the {name} kernels are not implemented")
    return name
