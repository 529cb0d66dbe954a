"""C++ demangling through libstdc++'s ``__cxa_demangle``: known Itanium examples, every C++
symbol libtorch exports checked against binutils' ``c++filt``, and the names left alone."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from otel_eacgm import demangle as demangle_module
from otel_eacgm.demangle import demangle
from otel_eacgm.kernel_names import KernelNames


@pytest.mark.parametrize(("mangled", "expected"), [
    ("_Z1fv", "f()"),
    ("_ZN9wikipedia7article6formatEv", "wikipedia::article::format()"),
    ("_ZNSt6vectorIiSaIiEE9push_backERKi", "std::vector<int, std::allocator<int> >::push_back(int const&)"),
    # A CUDA kernel's host stub, as nvcc names it, and a template kernel.
    ("_Z10add_kernelPfS_S_i", "add_kernel(float*, float*, float*, int)"),
    ("_Z6kernelIfEvPT_i", "void kernel<float>(float*, int)"),
    ("_ZN2at4_ops5addmm4callERKNS_6TensorES4_S4_RKN3c106ScalarES8_",
     "at::_ops::addmm::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, "
     "c10::Scalar const&, c10::Scalar const&)"),
    ("_ZL3foov", "foo()"),
    ("_ZTV3Foo", "vtable for Foo"),
    # libstdc++ abbreviates std::basic_ostream<char, ...> as std::ostream.
    ("_ZN2at5printERSoRKNS_6TensorEl", "at::print(std::ostream&, at::Tensor const&, long)"),
])
def test_itanium_names_are_demangled(mangled: str, expected: str) -> None:
    assert demangle(mangled) == expected


@pytest.mark.parametrize("name", [
    "cudaLaunchKernel",            # C API symbols
    "ncclAllReduce",
    "triton_poi_fused_add_0",      # Triton kernels are plain C names
    "[unknown]",
    "",
    "i",                           # __cxa_demangle would read this as the type "int"
    "Pf",                          # ... and this as "float*"
    "_Zfoo",                       # starts like a mangled name but is invalid
    "_Z",
    "_ZGVcN4v_Sleef_acos_u10",     # vector-function ABI name (libtorch exports hundreds)
])
def test_names_that_are_not_valid_cxx_symbols_come_back_unchanged(name: str) -> None:
    assert demangle(name) == name


def _exported_cxx_symbols(path: str) -> list[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        fields = line.split()
        if fields and fields[-1].startswith("_Z"):
            names.add(fields[-1].split("@")[0])  # nm appends symbol versions (name@@VERSION)
    return sorted(names)


@pytest.mark.skipif(shutil.which("nm") is None or shutil.which("c++filt") is None, reason="needs binutils")
@pytest.mark.parametrize("library", ["libtorch_cpu.so", "libtorch_cuda.so"])
def test_every_cxx_symbol_libtorch_exports_demangles_as_cxxfilt_does(library: str) -> None:
    torch_lib = os.path.join(os.path.dirname(pytest.importorskip("torch").__file__), "lib")
    path = os.path.join(torch_lib, library)
    if not os.path.exists(path):
        pytest.skip(f"{path} not installed")
    names = _exported_cxx_symbols(path)
    assert len(names) > 1000, f"{path}: only {len(names)} C++ symbols"
    # -i: no "implementation details", i.e. std::ostream rather than its basic_ostream spelling,
    # which is the form __cxa_demangle prints.
    reference = subprocess.run(["c++filt", "-i"], input="\n".join(names) + "\n", capture_output=True, text=True,
                               check=True).stdout.splitlines()
    assert len(reference) == len(names)
    mismatches = [(n, r, demangle(n)) for n, r in zip(names, reference) if demangle(n) != r]
    assert mismatches == []
    # Most of them were really demangled, not passed through.
    assert sum(demangle(n) != n for n in names) > 0.9 * len(names)


def test_results_are_cached_per_name() -> None:
    name = "_ZN2at4_ops3mul4callERKNS_6TensorES4_"
    demangle.cache_clear()
    first = demangle(name)
    again = demangle(name)
    info = demangle.cache_info()
    assert first == again == "at::_ops::mul::call(at::Tensor const&, at::Tensor const&)"
    assert (info.hits, info.misses) == (1, 1)


def test_without_libstdcxx_names_are_returned_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demangle_module, "_libstdcxx", None)
    demangle.cache_clear()
    try:
        assert demangle("_Z10add_kernelPfS_S_i") == "_Z10add_kernelPfS_S_i"
    finally:
        demangle.cache_clear()


def test_kernel_names_show_launches_demangled() -> None:
    names = KernelNames(lambda pid, addr: {0x1000: "_Z10add_kernelPfS_S_i"}.get(addr))
    names.record(7, 0xABC, "_Z6kernelIfEvPT_i")
    assert names.for_address(7, 0x1000) == "add_kernel(float*, float*, float*, int)"
    assert names.for_handle(7, 0xABC) == "void kernel<float>(float*, int)"
    assert names.for_address(7, 0x2000) == "[unknown]"
