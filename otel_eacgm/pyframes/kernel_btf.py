"""Where the running kernel keeps a task's fs base, from its BTF (/sys/kernel/btf/vmlinux).

CPython 3.10 knows its threads only by pthread_self, which on x86-64 is the thread's fs base;
the BPF walk reads it from the current task_struct (thread.fsbase). The kernel headers BCC
compiles against may be another version's than the running kernel (a VM image's), so the
offset comes from the running kernel's own type information instead.
"""

from __future__ import annotations

import functools
import struct

BTF_PATH = "/sys/kernel/btf/vmlinux"
_MAGIC = 0xEB9F
_STRUCT, _UNION = 4, 5
# bytes after the 12-byte btf_type, by kind: fixed, and per vlen item
_EXTRA = {1: (4, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 13: (0, 8), 14: (4, 0), 15: (0, 12),
          17: (4, 0), 19: (0, 12)}
_QUALIFIERS = (8, 9, 10, 11, 18)  # typedef, volatile, const, restrict, type tag


class BtfError(ValueError):
    """The kernel's BTF is missing or does not describe task_struct.thread.fsbase."""


def _types(data: bytes) -> tuple[list[tuple[int, int, int, int, list[tuple[int, int, int]]]], int]:
    magic, _version, _flags, hdr_len, type_off, type_len, str_off, _str_len = struct.unpack_from("<HBBIIIII", data)
    if magic != _MAGIC:
        raise BtfError(f"{BTF_PATH}: not BTF (magic {magic:#x})")
    pos, end = hdr_len + type_off, hdr_len + type_off + type_len
    types: list[tuple[int, int, int, int, list[tuple[int, int, int]]]] = [(0, 0, 0, 0, [])]  # type id 0: void
    while pos < end:
        name_off, info, size_or_type = struct.unpack_from("<III", data, pos)
        kind, vlen, kind_flag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
        pos += 12
        members = []
        if kind in (_STRUCT, _UNION):
            for i in range(vlen):
                m_name, m_type, m_off = struct.unpack_from("<III", data, pos + 12 * i)
                members.append((m_name, m_type, m_off & 0xFFFFFF if kind_flag else m_off))
        fixed, per = _EXTRA.get(kind, (0, 0))
        pos += fixed + per * vlen
        types.append((kind, name_off, size_or_type, kind_flag, members))
    return types, hdr_len + str_off


def _member_offset(data: bytes, types: list, strings: int, struct_id: int, name: str) -> tuple[int, int]:
    """(byte offset, type id) of member `name` of the struct with id `struct_id`."""
    def text(off: int) -> str:
        return data[strings + off:data.index(b"\0", strings + off)].decode()

    kind, _n, _size, _kf, members = types[struct_id]
    for m_name, m_type, m_bits in members:
        if text(m_name) == name:
            return m_bits // 8, m_type
    raise BtfError(f"no member {name} in BTF type {struct_id}")


@functools.lru_cache(maxsize=1)
def task_fsbase_offset(path: str = BTF_PATH) -> int:
    """offsetof(struct task_struct, thread.fsbase) in the running kernel."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise BtfError(f"{path}: {exc}") from None
    types, strings = _types(data)
    want = b"task_struct\0"
    task = next((i for i, t in enumerate(types) if t[0] == _STRUCT and data[strings + t[1]:strings + t[1] + len(want)] == want),
                None)
    if task is None:
        raise BtfError(f"{path}: no struct task_struct")
    thread_off, thread_type = _member_offset(data, types, strings, task, "thread")
    while types[thread_type][0] in _QUALIFIERS:
        thread_type = types[thread_type][2]
    fs_off, _ = _member_offset(data, types, strings, thread_type, "fsbase")
    return thread_off + fs_off
