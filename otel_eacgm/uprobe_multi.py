"""uprobe_multi links (kernel 6.6+) through the bpf() syscall, which BCC 0.26 does not wrap.

A perf-event uprobe is released with one kernel synchronisation each (about 0.1 s on the H200
host): an agent with 500 operator probes took a minute to let go of them, and the overhead
guardrail could not afford to cycle operator probes. One uprobe_multi link attaches any number
of offsets of one file in one call and is released with one synchronisation; a per-offset
cookie tells the single BPF program (calls.bpf.c `multi_probe`) which probe fired.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import platform

#: expected_attach_type of a program attached through uprobe_multi links.
BPF_TRACE_UPROBE_MULTI = 48
_BPF_LINK_CREATE = 28
_BPF_F_UPROBE_MULTI_RETURN = 1
_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_ATTR_SIZE = 64  # bpf_attr up to link_create.uprobe_multi.pid

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class LinkError(OSError):
    """The kernel refused a uprobe_multi link."""


@dataclasses.dataclass(frozen=True)
class LinkSpec:
    """What one link attaches."""

    path: str
    offsets: tuple[int, ...]
    cookies: tuple[int, ...]
    ref_ctr_offsets: tuple[int, ...] = ()  # USDT semaphores, one per offset (empty: none)
    retprobe: bool = False                 # uretprobes of the functions at the offsets
    pid: int = -1                          # fire only in this process (-1: every process)


def create(prog_fd: int, spec: LinkSpec) -> int:
    """Create the link; returns its fd (closing it detaches every probe of the link)."""
    n = len(spec.offsets)
    if n == 0 or len(spec.cookies) != n or (spec.ref_ctr_offsets and len(spec.ref_ctr_offsets) != n):
        raise ValueError(f"a link needs offsets with one cookie (and ref_ctr_offset) each: {spec}")
    path = ctypes.create_string_buffer(spec.path.encode())
    offsets = (ctypes.c_uint64 * n)(*spec.offsets)
    cookies = (ctypes.c_uint64 * n)(*spec.cookies)
    ref_ctrs = (ctypes.c_uint64 * n)(*spec.ref_ctr_offsets) if spec.ref_ctr_offsets else None
    attr = (ctypes.c_uint8 * _ATTR_SIZE)()
    base = ctypes.addressof(attr)

    def put(at: int, value: int, ctype: type) -> None:
        ctypes.memmove(base + at, ctypes.byref(ctype(value)), ctypes.sizeof(ctype))

    put(0, prog_fd, ctypes.c_uint32)
    put(8, BPF_TRACE_UPROBE_MULTI, ctypes.c_uint32)
    put(16, ctypes.addressof(path), ctypes.c_uint64)
    put(24, ctypes.addressof(offsets), ctypes.c_uint64)
    put(32, ctypes.addressof(ref_ctrs) if ref_ctrs is not None else 0, ctypes.c_uint64)
    put(40, ctypes.addressof(cookies), ctypes.c_uint64)
    put(48, n, ctypes.c_uint32)
    put(52, _BPF_F_UPROBE_MULTI_RETURN if spec.retprobe else 0, ctypes.c_uint32)
    put(56, max(spec.pid, 0), ctypes.c_uint32)
    fd = _libc.syscall(_syscall_number(), _BPF_LINK_CREATE, attr, _ATTR_SIZE)
    if fd < 0:
        err = ctypes.get_errno()
        raise LinkError(err, f"uprobe_multi link of {n} probes on {spec.path}: {os.strerror(err)}")
    return int(fd)


def supported(prog_fd: int) -> bool:
    """Whether this kernel has uprobe_multi links, asked as libbpf does: a link on the directory
    "/" fails with EBADF where the link type exists and EINVAL (or worse) where it does not."""
    try:
        os.close(create(prog_fd, LinkSpec(path="/", offsets=(0,), cookies=(0,))))
    except LinkError as exc:
        return exc.errno == errno.EBADF
    return False


def _syscall_number() -> int:
    try:
        return _SYS_BPF[platform.machine()]
    except KeyError:
        raise LinkError(errno.ENOSYS, f"no bpf() syscall number known for {platform.machine()}") from None


def cookie(slot: int, tail: int) -> int:
    """calls.bpf.c multi_probe's cookie: the common program in the high word, the slot in the low."""
    return (tail << 32) | slot

