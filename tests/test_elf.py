"""The ELF64 reader against real files (libcudart and libnccl from their wheels, the system
Python interpreter), each answer checked against binutils' readelf where that is independent."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from otel_eacgm.probes.elf import ElfError, ElfFile

pytestmark = pytest.mark.skipif(shutil.which("readelf") is None, reason="needs binutils' readelf for reference answers")

PYTHON = "/usr/bin/python3.11"  # Debian's interpreter, built --with-dtrace (it has stapsdt notes)


def _wheel_lib(package: str, name: str) -> str:
    module = pytest.importorskip(package)
    path = os.path.join(list(module.__path__)[0], "lib", name)
    if not os.path.exists(path):
        pytest.skip(f"{path} not installed")
    return path


@pytest.fixture(scope="module")
def libcudart() -> str:
    return _wheel_lib("nvidia.cu13", "libcudart.so.13")


@pytest.fixture(scope="module")
def libnccl() -> str:
    return _wheel_lib("nvidia.nccl", "libnccl.so.2")


@pytest.fixture(scope="module")
def python_exe() -> str:
    if not os.path.exists(PYTHON):
        pytest.skip(f"{PYTHON} not present")
    return PYTHON


@pytest.fixture(params=["libcudart", "libnccl", "python_exe"])
def real_elf(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue(request.param)


def readelf(*args: str) -> str:
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


def readelf_functions(path: str) -> Counter[tuple[str, int, int]]:
    """(name, value, size) of the defined FUNC symbols readelf lists in .dynsym."""
    out: Counter[tuple[str, int, int]] = Counter()
    for line in readelf("--dyn-syms", path).splitlines():
        f = line.split()
        if len(f) >= 8 and f[0].endswith(":") and f[3] == "FUNC" and f[6] != "UND":
            out[(f[7].split("@")[0], int(f[1], 16), int(f[2], 0))] += 1
    return out


def readelf_sections(path: str) -> dict[str, dict]:
    out = {}
    pattern = re.compile(r"^\s*\[\s*(\d+)\]\s+(\S+)\s+(\S+)\s+([0-9a-f]{16})\s+([0-9a-f]+)\s+([0-9a-f]+)\s+"
                         r"([0-9a-f]+)\s+([A-Za-z]*)\s+(\d+)")
    for line in readelf("-S", path).splitlines():
        m = pattern.match(line)
        if m and m.group(1) != "0":
            out[m.group(2)] = {"type": m.group(3), "addr": int(m.group(4), 16), "offset": int(m.group(5), 16),
                               "size": int(m.group(6), 16), "entsize": int(m.group(7), 16), "flags": m.group(8),
                               "link": int(m.group(9))}
    return out


def test_dynamic_functions_are_the_defined_funcs_readelf_lists(real_elf: str) -> None:
    with ElfFile(real_elf) as elf:
        ours = Counter(elf.dynamic_functions())
    reference = readelf_functions(real_elf)
    assert len(reference) > 100
    assert ours == reference


def test_prefix_keeps_only_matching_functions(libcudart: str) -> None:
    with ElfFile(libcudart) as elf:
        launch = {name for name, _, _ in elf.dynamic_functions(b"cudaLaunch")}
        everything = {name for name, _, _ in elf.dynamic_functions()}
    assert "cudaLaunchKernel" in launch
    assert launch == {n for n in everything if n.startswith("cudaLaunch")}
    assert "cudaMalloc" not in launch


def test_sections_match_readelf(real_elf: str) -> None:
    reference = readelf_sections(real_elf)
    with ElfFile(real_elf) as elf:
        ours = {s.name: s for s in elf.sections if s.name}
        assert set(ours) == set(reference)
        for name, ref in reference.items():
            s = ours[name]
            assert (s.addr, s.offset, s.size, s.entsize) == (ref["addr"], ref["offset"], ref["size"], ref["entsize"]), name
        dynsym = elf.section(".dynsym")
        assert dynsym.type == 11 and dynsym.entsize == 24
        assert elf.sections[dynsym.link].name == ".dynstr"
        assert elf.section(".no.such.section") is None
        assert elf.section_bytes(".no.such.section") == b""


def test_file_offset_translates_every_loaded_section_start(real_elf: str) -> None:
    # readelf's section table gives each allocated section's address and file offset on its own;
    # the reader must get the same offset through the program headers.
    loaded = {n: s for n, s in readelf_sections(real_elf).items() if "A" in s["flags"] and s["type"] != "NOBITS"}
    assert any(s["addr"] != s["offset"] for s in loaded.values()), "want at least one section where they differ"
    with ElfFile(real_elf) as elf:
        assert {n: elf.file_offset(s["addr"]) for n, s in loaded.items()} == {n: s["offset"] for n, s in loaded.items()}


def test_an_address_outside_every_segment_is_an_error_naming_it(libcudart: str) -> None:
    with ElfFile(libcudart) as elf, pytest.raises(ElfError, match=r"address 0xdead00000000 is in no PT_LOAD segment"):
        elf.file_offset(0xDEAD00000000)


def test_read_returns_the_file_bytes_at_a_function(python_exe: str) -> None:
    # /usr/bin/python3.11 is position-dependent (text at 0x41f000, file offset 0x1f000).
    text = readelf_sections(python_exe)[".text"]
    (_, value, size), = [k for k in readelf_functions(python_exe) if k[0] == "Py_Initialize"]
    with open(python_exe, "rb") as fh:
        fh.seek(value - text["addr"] + text["offset"])
        expected = fh.read(size)
    with ElfFile(python_exe) as elf:
        assert elf.e_type == 2  # ET_EXEC
        assert elf.read(value, size) == expected
        assert elf.file_offset(value) == value - 0x400000


def test_section_bytes_hold_the_build_id_readelf_reports(real_elf: str) -> None:
    build_id = re.search(r"Build ID: ([0-9a-f]+)", readelf("-n", real_elf)).group(1)
    with ElfFile(real_elf) as elf:
        note = elf.section_bytes(".note.gnu.build-id")
    assert note.hex().endswith(build_id)
    assert note[12:16] == b"GNU\0"


def test_usdt_notes_match_readelf(python_exe: str) -> None:
    reference = [
        {"provider": m[0], "name": m[1], "pc": int(m[2], 16), "base": int(m[3], 16), "semaphore": int(m[4], 16),
         "args": m[5]}
        for m in re.findall(r"Provider: (\S+)\n\s+Name: (\S+)\n\s+Location: (0x[0-9a-f]+), Base: (0x[0-9a-f]+), "
                            r"Semaphore: (0x[0-9a-f]+)\n\s+Arguments: (.*)", readelf("-n", python_exe))
    ]
    with ElfFile(python_exe) as elf:
        notes = elf.usdt_notes()
    assert {n.name for n in notes} >= {"function__entry", "function__return"}
    assert [n.__dict__ for n in notes] == reference


def test_usdt_probe_points_are_nops_and_semaphores_lie_in_probes(python_exe: str) -> None:
    sections = readelf_sections(python_exe)
    probes, base = sections[".probes"], sections[".stapsdt.base"]
    with ElfFile(python_exe) as elf:
        for note in elf.usdt_notes():
            assert note.base == base["addr"]
            assert elf.read(note.pc, 1) == b"\x90", f"{note.name}: no nop at {note.pc:#x}"  # STAP_PROBE's nop
            offset = elf.file_offset(note.semaphore)
            assert probes["offset"] <= offset < probes["offset"] + probes["size"]
            assert offset == note.semaphore - probes["addr"] + probes["offset"]
            assert elf.read(note.semaphore, 2) == b"\0\0"  # semaphores are zero until a tracer attaches


def test_a_library_without_usdt_probes_has_no_notes(libcudart: str) -> None:
    with ElfFile(libcudart) as elf:
        assert elf.e_type == 3  # ET_DYN
        assert elf.usdt_notes() == []


@pytest.mark.parametrize(("what", "content"), [
    ("empty", b""),
    ("text", b"#!/bin/sh\necho not an ELF\n"),
    ("short", b"\x7fELF"),
])
def test_files_that_are_not_elf_raise_elf_error(tmp_path: Path, what: str, content: bytes) -> None:
    path = tmp_path / what
    path.write_bytes(content)
    with pytest.raises(ElfError, match=str(path)):
        ElfFile(str(path))


@pytest.mark.parametrize(("byte", "value", "meaning"), [(4, 1, "ELFCLASS32"), (5, 2, "big-endian")])
def test_32_bit_and_big_endian_elf_are_refused(tmp_path: Path, python_exe: str, byte: int, value: int,
                                               meaning: str) -> None:
    data = bytearray(Path(python_exe).read_bytes()[:4096])
    data[byte] = value
    path = tmp_path / meaning
    path.write_bytes(bytes(data))
    with pytest.raises(ElfError, match="is not an ELF64 little-endian file"):
        ElfFile(str(path))


def test_a_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        ElfFile(str(tmp_path / "absent.so"))


def test_the_mapping_is_released_on_exit(libnccl: str) -> None:
    with ElfFile(libnccl) as elf:
        assert elf.section_bytes(".note.gnu.build-id")
    with pytest.raises(ValueError):
        elf.section_bytes(".note.gnu.build-id")
