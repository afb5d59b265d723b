"""Speed by default, checked as facts rather than timings (SPEC section 5,
docs/performance.md): the OpenBLAS kernels match the CPU's features and are
reported in the start-up log, /v1/models, /v2 and /metrics; a user's
OPENBLAS_CORETYPE wins, with a warning when it is weaker than the CPU allows.
"""
import re

import support

AVX512_CORES = {"SkylakeX", "Cooperlake", "SapphireRapids"}
AVX2_CORES = {"Haswell", "Zen"} | AVX512_CORES
AVX512_FLAGS = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


def cpu_flags():
    """The flags Linux lists for this CPU (it drops those the OS does not enable)."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def build_info(d):
    _, samples = support.parse_prometheus(d.get("/metrics").text)
    infos = [labels for name, labels, v in samples if name == "attnd_build_info" and v == 1]
    assert len(infos) == 1, "expected one attnd_build_info sample, got %r" % infos
    return infos[0]


def test_kernels_fit_the_cpu(daemons):
    d = daemons()
    flags = cpu_flags()
    compute = d.get("/v1/models").json()["compute"]
    core = compute["blas_core"]
    assert compute["blas_core_from_env"] is False
    if AVX512_FLAGS <= flags:
        assert core in AVX512_CORES, "AVX-512 CPU computes with %s" % core
    elif {"avx2", "fma"} <= flags:
        assert core in AVX2_CORES, "AVX2 CPU computes with %s" % core
    # the same core everywhere it is reported
    assert d.get("/v2").json()["blas_core"] == core
    info = build_info(d)
    assert info["blas_core"] == core
    assert re.fullmatch(r"\d+\.\d+\.\d+", info["version"]), info
    features = set(info["cpu_features"].split(","))
    assert features == set(compute["cpu_features"].split(","))
    # every feature named is one Linux lists (which spells one of them otherwise)
    linux = {"avx512bf16": "avx512_bf16"}
    assert {linux.get(f, f) for f in features} <= flags, features
    assert "blas core %s (chosen from the cpu features)" % core in d.stdout()
    assert not re.search(r" warn .*OpenBLAS", d.stdout()), d.stdout()


def test_user_coretype_wins(fresh_daemons):
    d = fresh_daemons(env={"OPENBLAS_CORETYPE": "Haswell"})
    compute = d.get("/v1/models").json()["compute"]
    assert compute["blas_core"] == "Haswell"
    assert compute["blas_core_from_env"] is True
    assert build_info(d)["blas_core"] == "Haswell"
    assert "blas core Haswell (from OPENBLAS_CORETYPE)" in d.stdout()
    if AVX512_FLAGS <= cpu_flags():
        assert re.search(r" warn OpenBLAS computes with its Haswell kernels, weaker than this CPU allows", d.stdout()), \
            d.stdout()
