"""C++ symbol demangling through libstdc++'s own ``__cxa_demangle`` (no subprocess, no copy)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_libstdcxx: ctypes.CDLL | None
try:
    _libstdcxx = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6")
    _cxa_demangle = _libstdcxx.__cxa_demangle
    _cxa_demangle.restype = ctypes.c_void_p
    _cxa_demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    _free = ctypes.CDLL(None).free
    _free.argtypes = [ctypes.c_void_p]
except (OSError, AttributeError):
    _libstdcxx = None


@functools.lru_cache(maxsize=8192)
def demangle(name: str) -> str:
    """Demangled form of an Itanium C++ name; other names (C symbols, Triton kernels) unchanged."""
    if _libstdcxx is None or not name.startswith("_Z"):
        return name
    status = ctypes.c_int(0)
    ptr = _cxa_demangle(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not ptr:
        return name
    try:
        return ctypes.string_at(ptr).decode(errors="replace")
    finally:
        _free(ptr)
