"""Attaching the catalog's probes to each distinct library file, once."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from otel_eacgm.bpf_loader import BpfError, CallProgram, SymbolMissing
from otel_eacgm.probes.catalog import ProbeSpec
from otel_eacgm.probes.libraries import MappedLibrary

log = logging.getLogger(__name__)


class Attacher:
    """Remembers which files carry probes; attaches a family's rows to each new file."""

    def __init__(self, program: CallProgram, rows: Iterable[tuple[int, ProbeSpec]]) -> None:
        self._program = program
        self._rows = list(rows)
        self._files: dict[tuple[int, int], str] = {}
        self.missing: dict[str, list[str]] = {}
        self.failed: dict[str, list[str]] = {}

    @property
    def files(self) -> dict[tuple[int, int], str]:
        """(dev, inode) -> path of every file with probes."""
        return dict(self._files)

    def ensure(self, lib: MappedLibrary) -> int:
        """Attach to `lib` unless its file already has probes; returns probes added."""
        if lib.file_key in self._files:
            return 0
        self._files[lib.file_key] = lib.path
        before = self._program.probe_count
        missing, failed = [], []
        for slot, spec in self._rows:
            if spec.family is not lib.family:
                continue
            try:
                self._program.attach(lib.path, spec, slot)
            except SymbolMissing:
                missing.append(spec.symbol)
            except BpfError as exc:
                failed.append(spec.symbol)
                log.error("%s", exc)
        added = self._program.probe_count - before
        if missing:
            self.missing[lib.path] = missing
            log.info("%s: %d symbols not in this version, skipped: %s", lib.path, len(missing), ", ".join(missing))
        if failed:
            self.failed[lib.path] = failed
        log.info("attached %d probes to %s (%s)", added, lib.path, lib.family.value)
        return added
