"""CUDA/NCCL enum names checked against independent sources: the real libcudart's own
``cudaGetErrorName``, and the enum definitions in the CUDA and NCCL headers the wheels ship."""

from __future__ import annotations

import ctypes
import os
import re

import pytest

from otel_eacgm.spans import error_type
from otel_eacgm.cuda_enums import (
    CUDA_DRIVER_ERRORS,
    CUDA_MEMCPY_KINDS,
    CUDA_RUNTIME_ERRORS,
    NCCL_DATATYPES,
    NCCL_REDUCE_OPS,
    NCCL_RESULTS,
    error_name,
)
from otel_eacgm.probes.catalog import CATALOG, Family


def _cuda_dir() -> str:
    import nvidia.cu13  # noqa: PLC0415

    return list(nvidia.cu13.__path__)[0]


def _nccl_header() -> str:
    import nvidia.nccl  # noqa: PLC0415

    with open(os.path.join(list(nvidia.nccl.__path__)[0], "include", "nccl.h")) as fh:
        return fh.read()


def _header(name: str) -> str:
    with open(os.path.join(_cuda_dir(), "include", name)) as fh:
        return fh.read()


def _enum(text: str, pattern: str) -> dict[int, set[str]]:
    """value -> every enumerator name of the first enum body matching `pattern` (a regex whose
    group 1 is the body)."""
    body = re.search(pattern, text, re.S)
    assert body is not None, f"enum {pattern!r} not found in the header"
    out: dict[int, set[str]] = {}
    for name, value in re.findall(r"(\w+)\s*=\s*(0x[0-9a-fA-F]+|\d+)", body.group(1)):
        out.setdefault(int(value, 0), set()).add(name)
    return out


@pytest.fixture(scope="module")
def cuda_get_error_name():
    lib = ctypes.CDLL(os.path.join(_cuda_dir(), "lib", "libcudart.so.13"))
    fn = lib.cudaGetErrorName
    fn.restype = ctypes.c_char_p
    fn.argtypes = [ctypes.c_int]
    return lambda code: fn(code).decode()


@pytest.mark.parametrize("code", sorted(CUDA_RUNTIME_ERRORS))
def test_runtime_error_names_are_what_libcudart_calls_them(code: int, cuda_get_error_name) -> None:
    assert CUDA_RUNTIME_ERRORS[code] == cuda_get_error_name(code)


def test_pitch_and_symbol_codes_are_12_and_13(cuda_get_error_name) -> None:
    """The table once had them at 11 and 12: code 12 got the pitch error's neighbour's name."""
    for code, name in ((12, "cudaErrorInvalidPitchValue"), (13, "cudaErrorInvalidSymbol")):
        assert cuda_get_error_name(code) == name
        assert error_name(CUDA_RUNTIME_ERRORS, code, "cudaError") == name
    assert 11 not in CUDA_RUNTIME_ERRORS


def test_runtime_names_agree_with_driver_types_h() -> None:
    header = _enum(_header("driver_types.h"), r"enum\s+__device_builtin__\s+cudaError\s*\{(.*?)\};")
    wrong = {c: n for c, n in CUDA_RUNTIME_ERRORS.items() if n not in header.get(c, set())}
    assert not wrong, wrong


def test_driver_error_names_match_cuda_h() -> None:
    header = _enum(_header("cuda.h"), r"typedef enum cudaError_enum \{(.*?)\} CUresult;")
    assert {c: n for c, n in CUDA_DRIVER_ERRORS.items() if n not in header.get(c, set())} == {}
    # The codes most worth a name on a training node are there.
    assert CUDA_DRIVER_ERRORS[2] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert CUDA_DRIVER_ERRORS[700] == "CUDA_ERROR_ILLEGAL_ADDRESS"


def test_nccl_results_cover_the_whole_enum_of_nccl_h() -> None:
    header = _enum(_nccl_header(), r"typedef enum \{\s*(ncclSuccess.*?)\}\s*ncclResult_t;")
    expected = {c: names.pop() for c, names in header.items() if names != {"ncclNumResults"}}
    assert NCCL_RESULTS == expected


def test_nccl_datatype_names_match_nccl_h() -> None:
    header = _enum(_nccl_header(), r"typedef enum \{\s*(ncclInt8.*?)\}\s*ncclDataType_t;")
    header = {c: {n.lower() for n in names} for c, names in header.items() if "ncclNumTypes" not in names}
    assert set(NCCL_DATATYPES) == set(header)
    for code, (name, _size) in NCCL_DATATYPES.items():
        assert f"nccl{name}" in header[code], (code, name, header[code])


def test_nccl_datatype_sizes_are_the_element_sizes_of_the_same_torch_dtypes() -> None:
    torch = pytest.importorskip("torch")
    torch_name = {"float8e4m3": "float8_e4m3fn", "float8e5m2": "float8_e5m2"}
    for code, (name, size) in NCCL_DATATYPES.items():
        assert size == getattr(torch, torch_name.get(name, name)).itemsize, (code, name, size)


def test_nccl_reduce_ops_match_nccl_h() -> None:
    header = _enum(_nccl_header(), r"typedef enum \{\s*(ncclSum.*?)\}\s*ncclRedOp_t;")
    for code, name in NCCL_REDUCE_OPS.items():
        assert f"nccl{name}" in {n.lower() for n in header[code]}, (code, name)
    assert set(NCCL_REDUCE_OPS) == {c for c, names in header.items() if c < 5}


def test_memcpy_kinds_match_driver_types_h() -> None:
    header = _enum(_header("driver_types.h"), r"enum\s+__device_builtin__\s+cudaMemcpyKind\s*\{(.*?)\};")
    assert {c: {f"cudaMemcpy{n}"} for c, n in CUDA_MEMCPY_KINDS.items()} == header


def test_error_name_falls_back_to_prefix_and_code() -> None:
    assert error_name(CUDA_RUNTIME_ERRORS, 2, "cudaError") == "cudaErrorMemoryAllocation"
    assert error_name(CUDA_RUNTIME_ERRORS, 12345, "cudaError") == "cudaError12345"
    assert error_name(NCCL_RESULTS, 8, "ncclResult") == "ncclResult8"
    assert error_name(CUDA_DRIVER_ERRORS, -1, "CUDA_ERROR_") == "CUDA_ERROR_-1"
    assert error_name({}, 0, "x") == "x0"


def test_span_error_type_names_return_codes_through_these_tables() -> None:
    row = {f: next(s for s in CATALOG if s.family == f) for f in (Family.CUDART, Family.CUDA, Family.NCCL)}
    assert error_type(row[Family.CUDART], 2) == "cudaErrorMemoryAllocation"
    assert error_type(row[Family.CUDA], 700) == "CUDA_ERROR_ILLEGAL_ADDRESS"
    assert error_type(row[Family.NCCL], 5) == "ncclInvalidUsage"
    # The return register arrives as 64 unsigned bits; its low 32 are the signed enum value.
    assert error_type(row[Family.NCCL], 2**64 - 1) == "ncclResult-1"
    assert error_type(row[Family.CUDART], (1 << 32) | 2) == "cudaErrorMemoryAllocation"
