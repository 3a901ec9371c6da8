"""ggml's x86 CPU variants (cpu-feats.cpp's score, the loader's choice, a build's feature list) against
hand-checked values from the C and llama.cpp's own system-info line."""
import pathlib

import pytest

from ggviz import cli, llama
from ggviz.ggml.cpu import cpu_feats

DATA = pathlib.Path(__file__).parent / "data" / "llamacpp"

HASWELL = {"pni", "ssse3", "fma", "sse4_2", "avx", "f16c", "avx2", "bmi2"}          # e.g. this VM's EPYC
ZEN4 = HASWELL | {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512vbmi", "avx512_vnni",
                  "avx512_bf16"}
SAPPHIRE = ZEN4 | {"avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}


@pytest.mark.parametrize("flags, best, score", [
    # cpu-feats.cpp: 1 + FMA 1 + F16C 2 + SSE42 4 + BMI2 8 + AVX 16 + AVX2 32 = 64
    (HASWELL, "haswell", 64),
    # + AVX512 128 + VBMI 256 + BF16 512 + VNNI 1024 = 1984 (cooperlake lacks VBMI: 1728; icelake lacks BF16: 1472)
    (ZEN4, "zen4", 1984),
    # + AMX_INT8 2048 (AMX_TILE has no bit of its own) = 4032; alderlake (AVX_VNNI) only 128
    (SAPPHIRE, "sapphirerapids", 4032),
    (set(), "x64", 1),               # no /proc/cpuinfo flags: only the baseline library loads
])
def test_the_loader_picks_the_highest_score(flags, best, score):
    cpu = cpu_feats.cpuid_x86(flags)
    assert cpu_feats.ggml_backend_load_best(cpu) == (best, score)


def test_a_missing_feature_scores_zero():
    cpu = cpu_feats.cpuid_x86(ZEN4 - {"avx512vl"})   # GGML_AVX512 requires F, CD, VL, DQ and BW
    assert cpu_feats.ggml_backend_cpu_x86_score("skylakex", cpu) == 0
    assert cpu_feats.ggml_backend_load_best(cpu) == ("haswell", 64)
    assert cpu_feats.ggml_backend_cpu_x86_score("cooperlake", cpu_feats.cpuid_x86(ZEN4)) == 1728


def test_system_info_is_the_haswell_builds():
    """llama_print_system_info of llama.cpp's AVX2 build, less OPENMP: ggviz's threadpool is ggml's own pool."""
    want = (DATA / "system_info.txt").read_text().rstrip("\n").replace("OPENMP = 1 | ", "")
    assert llama.print_system_info() == want


@pytest.mark.parametrize("value, words", [("icelake", "icelake kernels are not implemented"),
                                          ("skylake", "not one of ggml's x86 CPU variants")])
def test_an_unusable_variant_is_refused_in_two_lines(monkeypatch, capsys, value, words):
    monkeypatch.setenv("GGVIZ_CPU_VARIANT", value)
    with pytest.raises(cpu_feats.CpuVariantError, match=words):
        cpu_feats.cpu_variant()
    assert cli.main(["version"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and words in err[0] and "GGVIZ_CPU_VARIANT" in err[1]


def test_zen4_is_usable_and_names_its_unverified_kernels(monkeypatch):
    monkeypatch.setenv("GGVIZ_CPU_VARIANT", "zen4")
    assert cpu_feats.cpu_variant() == "zen4"
    warn = cpu_feats.variant_warning("zen4")
    unverified = [k for k, (st, _) in cpu_feats.ZEN4_KERNELS.items() if st != "verified"]
    assert len(warn.splitlines()) == 1 and unverified and all(k in warn for k in unverified)
    assert cpu_feats.variant_warning("haswell") == ""
