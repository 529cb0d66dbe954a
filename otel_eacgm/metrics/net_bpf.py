"""bpf/net.bpf.c loaded through BCC: TCP retransmit counts keyed by socket owner.

BCC itself is imported only by :mod:`otel_eacgm.bpf_program`; this module compiles through it
(its import guard, error type and ``bpf/`` location) so that remains true.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable

from otel_eacgm.bpf_program import BPF_DIR, BpfError, compile_program

_LOG = logging.getLogger(__name__)

SOURCE = BPF_DIR / "net.bpf.c"
#: TRACEPOINT_PROBEs in net.bpf.c; fewer attached means the program is not doing its job.
TRACEPOINTS = ("sock:sock_send_length", "sock:inet_sock_set_state", "tcp:tcp_retransmit_skb")


@dataclasses.dataclass(frozen=True)
class NetProgramOptions:
    """Compile-time knobs of net.bpf.c (see its header comment)."""

    owners_max: int = 65536
    counts_max: int = 16384

    def cflags(self) -> list[str]:
        """The -D flags for BCC; raises ValueError on a non-positive map size."""
        for name in ("owners_max", "counts_max"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{name}={value} must be > 0")
        return [f"-DOWNERS_MAX={self.owners_max}", f"-DCOUNTS_MAX={self.counts_max}"]


class NetProgram:
    """net.bpf.c in the kernel; its tracepoints attach on load."""

    def __init__(
        self, options: NetProgramOptions | None = None, *, dump: Callable[[str], None] | None = None
    ) -> None:
        self.options = options or NetProgramOptions()
        self._bpf = compile_program(SOURCE, self.options.cflags(), dump=dump,
                                    hint="Needs root, BPF and kernel headers.")
        attached = self._bpf.num_open_tracepoints()
        if attached != len(TRACEPOINTS):
            self._bpf.cleanup()
            raise BpfError(f"{SOURCE}: {attached} of {len(TRACEPOINTS)} tracepoints attached ({', '.join(TRACEPOINTS)})")

    def counts(self) -> dict[tuple[int, int], int]:
        """(owner tgid or 0, address family) -> retransmits since load."""
        return {(k.tgid, k.family): int(v.value) for k, v in self._bpf[b"retransmits"].items()}

    def forget(self, keys: Iterable[tuple[int, int]]) -> None:
        """Drop counts (of exited owners) so the map stays bounded."""
        table = self._bpf[b"retransmits"]
        for tgid, family in keys:
            try:
                del table[table.Key(tgid, family, 0)]
            except KeyError:
                _LOG.debug("retransmit key (%d, %d) already gone", tgid, family)

    def lost(self) -> int:
        """Retransmits not counted because the counts map was full."""
        return int(self._bpf[b"lost"][0].value)

    def close(self) -> None:
        """Detach the tracepoints and free the maps."""
        self._bpf.cleanup()
