"""The options scripts/setup.sh builds llama.cpp with, by the CPU's flags."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "llamacpp_build_options.sh"
AVX2 = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma bmi2 avx2"
AVX512 = "avx512f avx512cd avx512vl avx512dq avx512bw"


def options(tmp_path: Path, flags: str, machine: str = "x86_64") -> list[str]:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: a CPU\n"
        f"flags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n"
    )
    result = subprocess.run(
        ["bash", str(SCRIPT)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "SPECREPL_CPUINFO": str(cpuinfo), "SPECREPL_MACHINE": machine},
    )
    return result.stdout.split()


def test_an_avx2_cpu_gets_a_portable_avx2_build_without_amx_or_repacking(tmp_path):
    chosen = options(tmp_path, AVX2)
    assert "-DGGML_NATIVE=OFF" in chosen and "-DGGML_AVX2=ON" in chosen
    assert not any("AVX512" in option for option in chosen)
    for off in ("AMX_TILE", "AMX_INT8", "AMX_BF16", "CPU_REPACK"):
        assert f"-DGGML_{off}=OFF" in chosen


def test_an_avx512_cpu_gets_its_avx512_parts_and_still_no_amx(tmp_path):
    chosen = options(
        tmp_path, f"{AVX2} {AVX512} avx512vbmi avx512_vnni avx512_bf16 amx_tile amx_int8"
    )
    for part in ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"):
        assert f"-DGGML_{part}=ON" in chosen
    assert "-DGGML_AMX_TILE=OFF" in chosen and "-DGGML_AMX_INT8=OFF" in chosen
    assert "-DGGML_NATIVE=OFF" in chosen


def test_only_the_parts_the_cpu_lists(tmp_path):
    chosen = options(tmp_path, f"{AVX2} {AVX512} avx512_vnni")
    assert "-DGGML_AVX512=ON" in chosen and "-DGGML_AVX512_VNNI=ON" in chosen
    assert "-DGGML_AVX512_BF16=ON" not in chosen and "-DGGML_AVX512_VBMI=ON" not in chosen


@pytest.mark.parametrize("missing", AVX512.split())
def test_avx512_needs_every_subset_llama_cpp_compiles_with(tmp_path, missing):
    flags = " ".join(flag for flag in f"{AVX2} {AVX512} avx512_vnni".split() if flag != missing)
    chosen = options(tmp_path, flags)
    assert not any("AVX512" in option for option in chosen)
    assert "-DGGML_AVX2=ON" in chosen


def test_a_flag_is_matched_whole_not_as_a_prefix(tmp_path):
    # avx512f is not avx512fp16's prefix match, avx2 not avx2_something's
    chosen = options(tmp_path, "avx avx2_like avx512fp16")
    assert chosen == ["-DGGML_NATIVE=ON"]


@pytest.mark.parametrize(
    "flags, machine", [(f"{AVX2} {AVX512}", "aarch64"), ("fpu sse sse2 avx", "x86_64")]
)
def test_no_avx2_or_not_x86_builds_natively(tmp_path, flags, machine):
    assert options(tmp_path, flags, machine) == ["-DGGML_NATIVE=ON"]


def test_this_machine_gets_options_and_never_amx():
    chosen = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert chosen
    assert not any(option.startswith("-DGGML_AMX") and option.endswith("=ON") for option in chosen)


def test_a_rebuild_with_the_same_version_is_another_build(tmp_path, monkeypatch):
    """A stored verdict (the target's runtime, the trial, a draft source) must
    not outlive a rebuild of llama.cpp for other instruction sets, which keeps
    llama-cpp-python's version: the build's identity covers its library files."""
    import importlib.machinery
    import importlib.metadata
    import importlib.util

    from specrepl.engine import llamacpp

    package = tmp_path / "llama_cpp"
    (package / "lib").mkdir(parents=True)
    library = package / "lib" / "libggml-cpu.so"
    library.write_bytes(b"avx2 kernels")
    spec = importlib.machinery.ModuleSpec("llama_cpp", None, is_package=True)
    spec.submodule_search_locations = [str(package)]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.3.36")
    first = llamacpp.build_identity()
    assert first.startswith("llama-cpp-python=0.3.36 build=")
    assert llamacpp.build_identity() == first
    library.write_bytes(b"avx-512 kernels, longer")
    assert llamacpp.build_identity() != first

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert llamacpp.build_identity() == "llama-cpp-python=none"
