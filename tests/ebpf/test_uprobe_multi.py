"""uprobe_multi links made through the raw bpf() syscall: real links on the real libcudart and on
the interpreter's USDT probes, with a small BPF program that counts each cookie it is given
and unpacks it the way calls.bpf.c's ``multi_probe`` does."""

from __future__ import annotations

import errno
import os
import platform
import subprocess
import sys
from collections.abc import Iterator

import pytest

from otel_eacgm import uprobe_multi
from otel_eacgm.probes.elf import ElfFile

ebpf = pytest.mark.ebpf
needs_links = pytest.mark.skipif(
    tuple(int(x) for x in platform.release().split(".")[:2]) < (6, 6), reason="uprobe_multi links need kernel 6.6+")

# Keyed by process and by the cookie unpacked as calls.bpf.c does: (__u32)cookie, (int)(cookie >> 32).
COUNTER = b"""
struct key_t { u32 tgid; u32 slot; s32 tail; u32 pad; };
BPF_HASH(hits, struct key_t, u64, 1024);

int on_call(struct pt_regs *ctx)
{
    u64 cookie = bpf_get_attach_cookie(ctx);
    struct key_t k = {};
    k.tgid = bpf_get_current_pid_tgid() >> 32;
    k.slot = (u32)cookie;
    k.tail = (int)(cookie >> 32);
    u64 zero = 0, *n = hits.lookup_or_try_init(&k, &zero);
    if (n)
        __sync_fetch_and_add(n, 1);
    return 0;
}

int plain(struct pt_regs *ctx) { return 0; }
"""

# Waits for a line on stdin (so the test can link with the child's pid first), then calls two
# libcudart functions that need no GPU (argv[2] and argv[3] times) from one Python function;
# prints what the USDT semaphore at the address given as argv[4] holds at each step.
CHILD = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
sem = int(sys.argv[4]) if len(sys.argv) > 4 else 0
print("ready", ctypes.c_ushort.from_address(sem).value if sem else -1, flush=True)
sys.stdin.readline()

def work():  # a Python function: entering it fires python:function__entry where enabled
    v = ctypes.c_int()
    for _ in range(int(sys.argv[2])):
        lib.cudaRuntimeGetVersion(ctypes.byref(v))
    for _ in range(int(sys.argv[3])):
        lib.cudaDriverGetVersion(ctypes.byref(v))

if sem:
    sys.setprofile(lambda *args: None)  # CPython 3.11 fires function__entry only under a profiler (gh-98894)
work()
print("done", ctypes.c_ushort.from_address(sem).value if sem else -1, flush=True)
sys.stdin.readline()
print("end", ctypes.c_ushort.from_address(sem).value if sem else -1, flush=True)
"""


# --- no kernel needed ---------------------------------------------------------------------------

@pytest.mark.parametrize(("slot", "tail"), [(0, 0), (1, 1), (319, 3), (42, 4), (2**32 - 1, 2**31 - 1)])
def test_cookie_packs_the_slot_low_and_the_tail_high(slot: int, tail: int) -> None:
    c = uprobe_multi.cookie(slot, tail)
    assert c < 2**64
    assert (c & 0xFFFFFFFF, c >> 32) == (slot, tail)


def test_cookies_of_different_probes_differ() -> None:
    cookies = {uprobe_multi.cookie(slot, tail) for slot in range(320) for tail in (0, 1, 3, 4)}
    assert len(cookies) == 320 * 4


@pytest.mark.parametrize("spec", [
    uprobe_multi.LinkSpec("/lib.so", offsets=(), cookies=()),
    uprobe_multi.LinkSpec("/lib.so", offsets=(0x10, 0x20), cookies=(1,)),
    uprobe_multi.LinkSpec("/lib.so", offsets=(0x10,), cookies=(1, 2)),
    uprobe_multi.LinkSpec("/lib.so", offsets=(0x10, 0x20), cookies=(1, 2), ref_ctr_offsets=(0x6,)),
], ids=["no offsets", "fewer cookies", "more cookies", "fewer ref_ctr_offsets"])
def test_a_spec_without_one_cookie_per_offset_is_refused_before_any_syscall(spec: uprobe_multi.LinkSpec) -> None:
    with pytest.raises(ValueError, match="a link needs offsets with one cookie") as err:
        uprobe_multi.create(-1, spec)
    assert "/lib.so" in str(err.value)


def test_an_unknown_architecture_is_enosys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uprobe_multi.platform, "machine", lambda: "riscv64")
    with pytest.raises(uprobe_multi.LinkError, match="no bpf\\(\\) syscall number known for riscv64") as err:
        uprobe_multi.create(-1, uprobe_multi.LinkSpec("/lib.so", (0x10,), (1,)))
    assert err.value.errno == errno.ENOSYS


# --- real links ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def counter() -> Iterator[tuple]:
    from bcc import BPF  # noqa: PLC0415

    bpf = BPF(text=COUNTER)
    try:
        fd = bpf.load_func(b"on_call", BPF.KPROBE, None, uprobe_multi.BPF_TRACE_UPROBE_MULTI).fd
        yield bpf, fd
    finally:
        bpf.cleanup()


def libcudart() -> str:
    import nvidia.cu13  # noqa: PLC0415

    return os.path.join(list(nvidia.cu13.__path__)[0], "lib", "libcudart.so.13")


def offsets(path: str, *names: str) -> list[int]:
    with ElfFile(path) as elf:
        where = {name: elf.file_offset(value) for name, value, _ in elf.dynamic_functions(b"cuda")}
    return [where[n] for n in names]


class Child:
    """The CHILD workload, held at its first stdin line until go()."""

    def __init__(self, n_runtime: int, n_driver: int, semaphore: int = 0) -> None:
        args = [sys.executable, "-c", CHILD, libcudart(), str(n_runtime), str(n_driver)]
        self.proc = subprocess.Popen(args + ([str(semaphore)] if semaphore else []), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.ready = self._line("ready")

    def _line(self, word: str) -> int:
        line = self.proc.stdout.readline().split()
        assert line and line[0] == word, line
        return int(line[1])

    def go(self) -> int:
        """Run the calls; returns the semaphore value seen after them."""
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return self._line("done")

    def finish(self) -> int:
        """Let the child exit; returns the semaphore value it saw last."""
        out, _ = self.proc.communicate("\n", timeout=30)
        assert self.proc.returncode == 0
        word, value = out.split()
        assert word == "end", out
        return int(value)


def hits(bpf, pid: int) -> dict[tuple[int, int], int]:  # noqa: ANN001
    return {(k.slot, k.tail): v.value for k, v in bpf[b"hits"].items() if k.tgid == pid}


def run(bpf, n_runtime: int, n_driver: int) -> dict[tuple[int, int], int]:  # noqa: ANN001
    child = Child(n_runtime, n_driver)
    child.go()
    child.finish()
    return hits(bpf, child.pid)


@ebpf
@needs_links
def test_supported_on_a_program_loaded_for_uprobe_multi(counter) -> None:  # noqa: ANN001
    assert uprobe_multi.supported(counter[1]) is True


@ebpf
@needs_links
def test_not_supported_for_a_program_loaded_without_the_attach_type(counter) -> None:  # noqa: ANN001
    from bcc import BPF  # noqa: PLC0415

    plain = counter[0].load_func(b"plain", BPF.KPROBE).fd
    assert uprobe_multi.supported(plain) is False
    with pytest.raises(uprobe_multi.LinkError) as err:
        uprobe_multi.create(plain, uprobe_multi.LinkSpec(libcudart(), tuple(offsets(libcudart(), "cudaMalloc")), (1,)))
    assert err.value.errno == errno.EINVAL


@ebpf
@needs_links
def test_one_link_fires_each_offset_with_its_own_cookie_until_closed(counter) -> None:  # noqa: ANN001
    bpf, fd = counter
    lib = libcudart()
    runtime, driver = offsets(lib, "cudaRuntimeGetVersion", "cudaDriverGetVersion")
    link = uprobe_multi.create(fd, uprobe_multi.LinkSpec(
        lib, (runtime, driver), (uprobe_multi.cookie(7, 0), uprobe_multi.cookie(300, 3))))
    try:
        assert link >= 0
        assert run(bpf, 5, 3) == {(7, 0): 5, (300, 3): 3}
    finally:
        os.close(link)
    assert run(bpf, 5, 3) == {}  # closing the fd detached both probes


@ebpf
@needs_links
def test_a_return_link_fires_on_return(counter) -> None:  # noqa: ANN001
    bpf, fd = counter
    lib = libcudart()
    link = uprobe_multi.create(fd, uprobe_multi.LinkSpec(
        lib, tuple(offsets(lib, "cudaDriverGetVersion")), (uprobe_multi.cookie(9, 1),), retprobe=True))
    try:
        assert run(bpf, 2, 4) == {(9, 1): 4}
    finally:
        os.close(link)


@ebpf
@needs_links
def test_a_pid_link_fires_only_in_that_process(counter) -> None:  # noqa: ANN001
    bpf, fd = counter
    lib = libcudart()
    mine, other = Child(6, 0), Child(6, 0)
    link = uprobe_multi.create(fd, uprobe_multi.LinkSpec(
        lib, tuple(offsets(lib, "cudaRuntimeGetVersion")), (uprobe_multi.cookie(11, 0),), pid=mine.pid))
    try:
        mine.go()
        other.go()
    finally:
        os.close(link)
        mine.finish()
        other.finish()
    assert hits(bpf, mine.pid) == {(11, 0): 6}
    assert hits(bpf, other.pid) == {}


@ebpf
@needs_links
def test_ref_ctr_offsets_raise_the_usdt_semaphore_while_linked(counter) -> None:  # noqa: ANN001
    """The interpreter's python:function__entry probe with its semaphore: the kernel counts the
    semaphore up in the traced process while the link exists, and down again once closed."""
    bpf, fd = counter
    exe = os.path.realpath(sys.executable)
    with ElfFile(exe) as elf:
        if elf.e_type != 2:
            pytest.skip(f"{exe} is position-independent; the child could not find the semaphore address")
        note = next((n for n in elf.usdt_notes() if n.name == "function__entry"), None)
        if note is None:
            pytest.skip(f"{exe} has no python:function__entry USDT probe")
        pc, sem = elf.file_offset(note.pc), elf.file_offset(note.semaphore)
    child = Child(0, 0, semaphore=note.semaphore)
    assert child.ready == 0
    link = uprobe_multi.create(fd, uprobe_multi.LinkSpec(
        exe, (pc,), (uprobe_multi.cookie(13, 3),), ref_ctr_offsets=(sem,), pid=child.pid))
    try:
        assert child.go() == 1
    finally:
        os.close(link)
    assert child.finish() == 0
    # With the semaphore up the interpreter fired the probe for the functions it entered.
    assert hits(bpf, child.pid).get((13, 3), 0) > 0


@ebpf
@needs_links
@pytest.mark.parametrize(("path", "offset", "code"), [
    (None, "past the end", errno.EINVAL),
    ("/nonexistent/libcudart.so.13", 0x1000, errno.ENOENT),
])
def test_a_refused_link_is_a_link_error_naming_the_file(counter, path, offset, code) -> None:  # noqa: ANN001
    lib = path or libcudart()
    if offset == "past the end":
        offset = os.path.getsize(lib) + 4096
    with pytest.raises(uprobe_multi.LinkError) as err:
        uprobe_multi.create(counter[1], uprobe_multi.LinkSpec(lib, (offset,), (1,)))
    assert err.value.errno == code
    assert f"uprobe_multi link of 1 probes on {lib}: {os.strerror(code)}" in str(err.value)


@ebpf
@needs_links
def test_a_link_for_a_process_that_does_not_exist_is_esrch(counter) -> None:  # noqa: ANN001
    with pytest.raises(uprobe_multi.LinkError) as err:
        uprobe_multi.create(counter[1], uprobe_multi.LinkSpec(
            libcudart(), tuple(offsets(libcudart(), "cudaMalloc")), (1,), pid=2**22 + 12345))
    assert err.value.errno == errno.ESRCH
