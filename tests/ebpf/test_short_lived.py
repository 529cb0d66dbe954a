"""A process that exits before its per-process probes are linked (the `ldconfig -p` child that
`import torch` runs) is counted and logged at DEBUG, with one INFO summary: no ERROR, nothing
marked failed. Real kernel: the uprobe_multi link for a reaped pid is refused with ESRCH."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from otel_eacgm.attach import Attacher
from otel_eacgm.bpf_program import CallProgram, ProgramOptions
from otel_eacgm.probe_links import ProbeLinks
from otel_eacgm.probes.catalog import Family
from otel_eacgm.probes.libraries import libraries_of

pytestmark = pytest.mark.ebpf


def exited_pid() -> int:
    """The pid of a real Python process that has exited and been reaped."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    pid = int(child.stdout)
    assert not os.path.exists(f"/proc/{pid}")
    return pid


def test_probes_of_an_exited_process_are_counted_not_errors(caplog: pytest.LogCaptureFixture) -> None:
    (interpreter,) = [lib for lib in libraries_of(os.getpid()) if lib.family is Family.PYTHON]
    program = CallProgram(ProgramOptions(filter_pids=True))
    links = ProbeLinks(program)
    attacher = Attacher(program, links, [], python=True, python_pid_scoped=True)
    try:
        caplog.set_level(logging.DEBUG)
        gone = [exited_pid(), exited_pid()]
        assert [attacher.ensure(interpreter, pid) for pid in gone] == [0, 0]
        assert attacher.short_lived.count == 2
        assert attacher.failed == {}
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
        # (the CPython 3.11 note on entry probes is a WARNING of its own, about every 3.11 interpreter)
        assert not [r for r in caplog.records if r.levelno == logging.WARNING and "No such process" in r.getMessage()]
        debug = [r.getMessage() for r in caplog.records if r.name == "otel_eacgm.short_lived" and r.levelno == logging.DEBUG]
        assert len(debug) == 2 and all(f"pid {pid} exited" in line for pid, line in zip(gone, debug))
        info = [r.getMessage() for r in caplog.records if r.name == "otel_eacgm.short_lived" and r.levelno == logging.INFO]
        assert len(info) == 1 and info[0].startswith("1 short-lived process(es)"), info  # rate-limited
        # a live process still gets its probes: the counting did not swallow real attaches
        assert attacher.ensure(interpreter, os.getpid()) > 0
    finally:
        links.release()
        program.close()


def test_scoped_catalog_probes_of_an_exited_process_are_counted_and_leave_no_link() -> None:
    """Scoped probes: a child gone before its libraries are linked (a held fork that was killed)
    is counted like the Python layer's, and the links made for it before the refusal are closed."""
    from otel_eacgm.probes.catalog import CATALOG  # noqa: PLC0415
    from otel_eacgm.probes.libraries import MappedLibrary  # noqa: PLC0415

    import nvidia.cu13  # noqa: PLC0415

    path = os.path.realpath(os.path.join(list(nvidia.cu13.__path__)[0], "lib", "libcudart.so.13"))
    st = os.stat(path)
    lib = MappedLibrary(path=path, family=Family.CUDART, file_key=(st.st_dev, st.st_ino))
    program = CallProgram(ProgramOptions(filter_pids=True))
    links = ProbeLinks(program)
    rows = [(slot, spec) for slot, spec in enumerate(CATALOG) if spec.family is Family.CUDART]
    attacher = Attacher(program, links, rows, scoped=True)
    try:
        assert attacher.ensure(lib, exited_pid()) == 0
        assert attacher.short_lived.count == 1
        assert (links.probe_count, links.link_count, attacher.failed) == (0, 0, {})
        assert attacher.ensure(lib, os.getpid()) > 0  # a live process is linked
        assert links.link_count > 0
        assert attacher.forget_process(os.getpid()) > 0
        assert (links.probe_count, links.link_count) == (0, 0)
    finally:
        links.release()
        program.close()
