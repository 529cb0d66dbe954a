"""A small ELF64 (little-endian) reader: symbols, loadable segments, stapsdt notes.

Enough to find probe points without shelling out to readelf/nm and without asking BCC to
re-read a 400 MB libtorch_cpu.so's symbol table once per symbol: the file is mapped once and
every offset the agent attaches to is computed here (virtual address -> file offset through the
PT_LOAD headers, which is what the kernel's uprobe interface takes).
"""

from __future__ import annotations

import dataclasses
import mmap
import struct
from collections.abc import Iterator

import numpy as np

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_PHDR = struct.Struct("<IIQQQQQQ")
_SYM = struct.Struct("<IBBHQQ")
_SYM_DTYPE = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"),
                       ("size", "<u8")])
_SHT_SYMTAB, _SHT_NOTE, _SHT_DYNSYM, _PT_LOAD = 2, 7, 11, 1
_STT_FUNC = 2
_NT_STAPSDT = 3


class ElfError(ValueError):
    """The file is not an ELF64 little-endian object the agent can read."""


@dataclasses.dataclass(frozen=True)
class Section:
    """One section header."""

    name: str
    type: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclasses.dataclass(frozen=True)
class UsdtNote:
    """One SystemTap SDT probe (``.note.stapsdt``), addresses as linked."""

    provider: str
    name: str
    pc: int
    base: int
    semaphore: int
    args: str


class ElfFile:
    """A read-only mapping of one ELF file; use as a context manager."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as fh:
            try:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as exc:  # empty file
                raise ElfError(f"{path}: cannot map ({exc})") from None
        head = self._map[:_EHDR.size]
        if len(head) < _EHDR.size or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            self.close()
            raise ElfError(f"{path} is not an ELF64 little-endian file")
        (_ident, self.e_type, _machine, _version, _entry, phoff, shoff, _flags, _ehsize,
         phentsize, phnum, shentsize, shnum, shstrndx) = _EHDR.unpack(head)
        self.segments = [_PHDR.unpack_from(self._map, phoff + i * phentsize) for i in range(phnum)]
        raw = [_SHDR.unpack_from(self._map, shoff + i * shentsize) for i in range(shnum)]
        names_off = raw[shstrndx][4] if shnum else 0
        self.sections = [Section(self._cstr(names_off + r[0]), r[1], r[3], r[4], r[5], r[6], r[9]) for r in raw]

    def __enter__(self) -> ElfFile:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Unmap the file."""
        self._map.close()

    def _cstr(self, offset: int) -> str:
        end = self._map.find(b"\0", offset)
        return self._map[offset:end].decode(errors="replace")

    def section(self, name: str) -> Section | None:
        """The first section called `name`."""
        return next((s for s in self.sections if s.name == name), None)

    def file_offset(self, vaddr: int) -> int:
        """File offset of a virtual address, through the PT_LOAD segment holding it."""
        for p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, p_memsz, _align in self.segments:
            if p_type == _PT_LOAD and p_vaddr <= vaddr < p_vaddr + max(p_filesz, p_memsz):
                return vaddr - p_vaddr + p_offset
        raise ElfError(f"{self.path}: address {vaddr:#x} is in no PT_LOAD segment")

    def vaddr(self, file_offset: int) -> int:
        """Virtual address of a file offset, through the PT_LOAD segment holding it."""
        for p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align in self.segments:
            if p_type == _PT_LOAD and p_offset <= file_offset < p_offset + p_filesz:
                return file_offset - p_offset + p_vaddr
        raise ElfError(f"{self.path}: file offset {file_offset:#x} is in no PT_LOAD segment")

    def dynamic_functions(self, prefix: bytes = b"") -> Iterator[tuple[str, int, int]]:
        """(name, value, size) of defined function symbols in .dynsym whose name starts with `prefix`."""
        sec = next((s for s in self.sections if s.type == _SHT_DYNSYM), None)
        if sec is None:
            return
        yield from self._functions(sec, prefix)

    def function_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every defined function symbol of .symtab and .dynsym, sorted by address, as arrays:
        values, sizes, and the file offset of each name (`cstr`). Arrays, not objects: a
        libtorch holds hundreds of thousands of symbols, and a lookup needs one name."""
        values, sizes, names = [], [], []
        for sec in self.sections:
            if sec.type not in (_SHT_SYMTAB, _SHT_DYNSYM):
                continue
            syms = np.frombuffer(self._map, _SYM_DTYPE, count=sec.size // _SYM.size, offset=sec.offset)
            kept = syms[((syms["info"] & 0xF) == _STT_FUNC) & (syms["shndx"] != 0) & (syms["value"] != 0)]
            del syms  # a view into the mapping: close() would fail while it lives
            values.append(kept["value"])
            sizes.append(kept["size"])
            names.append(kept["name"].astype(np.uint64) + self.sections[sec.link].offset)
        if not values:
            empty = np.zeros(0, np.uint64)
            return empty, empty, empty
        value, size, name = np.concatenate(values), np.concatenate(sizes), np.concatenate(names)
        order = np.argsort(value, kind="stable")
        return value[order], size[order], name[order]

    def symbol(self, name: str) -> int | None:
        """The value of the defined symbol `name` (any type) in .dynsym or .symtab, None if absent."""
        want = name.encode() + b"\0"
        for sec in self.sections:
            if sec.type not in (_SHT_SYMTAB, _SHT_DYNSYM):
                continue
            strtab = self.sections[sec.link]
            syms = np.frombuffer(self._map, _SYM_DTYPE, count=sec.size // _SYM.size, offset=sec.offset)
            defined = syms[(syms["shndx"] != 0) & (syms["value"] != 0)]
            del syms  # a view into the mapping: close() would fail while it lives
            for st_name, value in zip(defined["name"].tolist(), defined["value"].tolist()):
                start = strtab.offset + st_name
                if self._map[start:start + len(want)] == want:
                    return value
        return None

    def cstr(self, offset: int) -> str:
        """The NUL-terminated string at a file offset (a symbol's name)."""
        return self._cstr(offset)

    def _functions(self, sec: Section, prefix: bytes) -> Iterator[tuple[str, int, int]]:
        strtab = self.sections[sec.link]
        m = self._map
        for i in range(sec.size // _SYM.size):
            st_name, st_info, _other, st_shndx, st_value, st_size = _SYM.unpack_from(m, sec.offset + i * _SYM.size)
            if st_info & 0xF != _STT_FUNC or st_shndx == 0 or not st_value:
                continue
            start = strtab.offset + st_name
            if prefix and m[start:start + len(prefix)] != prefix:
                continue
            yield self._cstr(start), st_value, st_size

    def read(self, vaddr: int, size: int) -> bytes:
        """`size` bytes of the file at a virtual address."""
        off = self.file_offset(vaddr)
        return self._map[off:off + size]

    def section_bytes(self, name: str) -> bytes:
        """The contents of section `name` (empty if absent)."""
        sec = self.section(name)
        return b"" if sec is None else self._map[sec.offset:sec.offset + sec.size]

    def usdt_notes(self) -> list[UsdtNote]:
        """Every stapsdt probe of the file."""
        out = []
        for sec in self.sections:
            if sec.type != _SHT_NOTE or sec.name != ".note.stapsdt":
                continue
            pos, end = sec.offset, sec.offset + sec.size
            while pos + 12 <= end:
                namesz, descsz, ntype = struct.unpack_from("<III", self._map, pos)
                name_at = pos + 12
                desc_at = name_at + (namesz + 3 & ~3)
                pos = desc_at + (descsz + 3 & ~3)
                if ntype != _NT_STAPSDT or self._map[name_at:name_at + namesz].rstrip(b"\0") != b"stapsdt":
                    continue
                pc, base, sem = struct.unpack_from("<QQQ", self._map, desc_at)
                strings = self._map[desc_at + 24:desc_at + descsz].split(b"\0")
                provider, probe, args = (s.decode(errors="replace") for s in (strings + [b"", b"", b""])[:3])
                out.append(UsdtNote(provider, probe, pc, base, sem, args))
        return out
