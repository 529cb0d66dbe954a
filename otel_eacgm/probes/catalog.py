"""The declarative probe catalog: which library function is probed, how, and how it is decoded.

Adding a traced function means adding a row here (and, at most, a decoder in decoders.py).
Rows are addressed by their index (the BPF probe slot), so rows are only ever appended within
a family block and the catalog stays below calls.bpf.c's EACGM_PROBE_SLOTS.
"""

from __future__ import annotations

import dataclasses
import enum

from otel_eacgm.decoders import DECODERS


class Layer(str, enum.Enum):
    """`eacgm.layer` values."""

    CUDA_RUNTIME = "cuda.runtime"
    CUDA_DRIVER = "cuda.driver"
    NCCL = "nccl"
    TORCH = "torch"    # ATen operators (probes/torch_ops.py), discovered per libtorch_cpu build
    PYTHON = "python"  # CPython USDT function probes (probes/python_usdt.py)


class Family(str, enum.Enum):
    """Library families, matched against the file names processes map."""

    CUDART = "cudart"
    CUDA = "cuda"
    NCCL = "nccl"
    TORCH = "torch"    # libtorch_cpu.so
    PYTHON = "python"  # an interpreter executable or libpython3.X.so


class Role(str, enum.Enum):
    """What the agent does with a call besides making a span."""

    CALL = "call"
    LAUNCH = "launch"            # a kernel launch; which launch layer is traced is configurable
    NAME_RECORD = "name_record"  # returns a handle for a named kernel (name records of the launch layer)


@dataclasses.dataclass(frozen=True)
class ProbeSpec:
    """One traced function.

    ``has_return`` attaches a uretprobe too, for calls whose duration or result matters; pure
    asynchronous launches are entry-only (one probe hit per launch, see docs/design.md).
    ``cyclable``: a call with a return probe that only enqueues work on a stream and never
    waits for the device (memsets, device-to-device copies), which the overhead guardrail may
    duty-cycle like launches; calls that wait (synchronisations, host copies, NCCL) stay
    attached, and the guardrail measures what a probe hit costs from their rate.
    ``deref_arg`` / ``out_arg`` / ``str_arg`` are argument indexes (0-5 registers, 6-9 stack
    slots) whose pointee struct is copied at entry, whose pointee word is read at return, or
    whose C string is copied at return.
    """

    family: Family
    layer: Layer
    symbol: str
    decoder: str
    has_return: bool = True
    role: Role = Role.CALL
    deref_arg: int = -1
    out_arg: int = -1
    str_arg: int = -1
    exit_probes: bool = False    # returns probed at return instructions, not by uretprobe (torch_ops.with_exits)
    cyclable: bool = False       # enqueue-only call with a return probe: the guardrail may cycle it
    returns_status: bool = True  # the return value is a status code (CUDA/NCCL), not data
    attributes: tuple[tuple[str, str], ...] = ()  # constant span attributes (torch.op.*)
    # In-kernel call statistics (bpf/calls.bpf.c `account`): one series per value of key_arg
    # (the launched kernel, the NCCL communicator), and bytes = args[count_arg] x datatype size.
    key_arg: int = -1
    count_arg: int = -1
    dtype_arg: int = -1

    @property
    def always_send(self) -> bool:
        """Every call reaches the agent, sampled or not: its decoder keeps state that later spans
        need (kernel names of handles, allocation sizes, communicator sizes)."""
        return self.role is Role.NAME_RECORD or DECODERS[self.decoder].stateful


def _rt(symbol: str, decoder: str, **kw: object) -> ProbeSpec:
    return ProbeSpec(Family.CUDART, Layer.CUDA_RUNTIME, symbol, decoder, **kw)  # type: ignore[arg-type]


def _drv(symbol: str, decoder: str, **kw: object) -> ProbeSpec:
    return ProbeSpec(Family.CUDA, Layer.CUDA_DRIVER, symbol, decoder, **kw)  # type: ignore[arg-type]


def _nccl(symbol: str, decoder: str, **kw: object) -> ProbeSpec:
    return ProbeSpec(Family.NCCL, Layer.NCCL, symbol, decoder, **kw)  # type: ignore[arg-type]


CATALOG: tuple[ProbeSpec, ...] = (
    # CUDA runtime (libcudart)
    _rt("cudaLaunchKernel", "rt_launch", has_return=False, role=Role.LAUNCH, key_arg=0),
    _rt("cudaLaunchKernelExC", "rt_launch_ex", has_return=False, role=Role.LAUNCH, deref_arg=0, key_arg=1),
    _rt("cudaGraphLaunch", "graph_launch"),
    _rt("cudaMalloc", "malloc", out_arg=0),
    _rt("cudaMallocAsync", "malloc_async", out_arg=0),
    _rt("cudaFree", "free"),
    _rt("cudaFreeAsync", "free_async"),
    _rt("cudaMemcpy", "memcpy"),
    _rt("cudaMemcpyAsync", "memcpy_async"),
    _rt("cudaMemset", "memset"),
    _rt("cudaMemsetAsync", "memset_async", cyclable=True),
    _rt("cudaStreamSynchronize", "stream_arg0"),
    _rt("cudaDeviceSynchronize", "no_args"),
    _rt("cudaEventSynchronize", "event_sync"),
    _rt("cudaStreamWaitEvent", "stream_wait_event"),
    _rt("cudaSetDevice", "set_device"),
    # nvcc 12.8+ stubs resolve a kernel once per launch site and launch by the handle (a heap
    # address): this name record maps the handle to the host stub's symbol.
    _rt("__cudaGetKernel", "get_kernel", role=Role.NAME_RECORD, out_arg=0),
    # CUDA driver (libcuda)
    _drv("cuLaunchKernel", "drv_launch", has_return=False, role=Role.LAUNCH, key_arg=0),
    _drv("cuLaunchKernelEx", "drv_launch_ex", has_return=False, role=Role.LAUNCH, deref_arg=0, key_arg=1),
    _drv("cuGraphLaunch", "graph_launch"),
    _drv("cuMemAlloc_v2", "malloc", out_arg=0),
    _drv("cuMemAllocAsync", "malloc_async", out_arg=0),
    _drv("cuMemFree_v2", "free"),
    _drv("cuMemFreeAsync", "free_async"),
    _drv("cuMemcpyAsync", "drv_memcpy_async"),
    _drv("cuMemcpyHtoDAsync_v2", "drv_memcpy_async"),
    _drv("cuMemcpyDtoHAsync_v2", "drv_memcpy_async"),
    _drv("cuMemcpyDtoDAsync_v2", "drv_memcpy_async", cyclable=True),
    _drv("cuStreamSynchronize", "stream_arg0"),
    _drv("cuCtxSynchronize", "no_args"),
    _drv("cuModuleGetFunction", "name_record", role=Role.NAME_RECORD, out_arg=0, str_arg=2),
    _drv("cuLibraryGetKernel", "name_record", role=Role.NAME_RECORD, out_arg=0, str_arg=2),
    _drv("cuKernelGetFunction", "kernel_get_function", role=Role.NAME_RECORD, out_arg=0),
    # NCCL (libnccl)
    # (argument positions as in decoders.py: count, datatype, communicator)
    _nccl("ncclAllReduce", "nccl_allreduce", count_arg=2, dtype_arg=3, key_arg=5),
    _nccl("ncclReduce", "nccl_reduce", count_arg=2, dtype_arg=3, key_arg=6),
    _nccl("ncclBroadcast", "nccl_broadcast", count_arg=2, dtype_arg=3, key_arg=5),
    _nccl("ncclBcast", "nccl_bcast", count_arg=1, dtype_arg=2, key_arg=4),
    _nccl("ncclAllGather", "nccl_allgather", count_arg=2, dtype_arg=3, key_arg=4),
    _nccl("ncclReduceScatter", "nccl_allreduce", count_arg=2, dtype_arg=3, key_arg=5),
    _nccl("ncclAlltoAll", "nccl_alltoall", count_arg=2, dtype_arg=3, key_arg=4),
    _nccl("ncclSend", "nccl_p2p", count_arg=1, dtype_arg=2, key_arg=4),
    _nccl("ncclRecv", "nccl_p2p", count_arg=1, dtype_arg=2, key_arg=4),
    _nccl("ncclGroupStart", "no_args"),
    _nccl("ncclGroupEnd", "no_args"),
    _nccl("ncclCommInitRank", "nccl_comm_init", out_arg=0),
    _nccl("ncclCommInitRankConfig", "nccl_comm_init", out_arg=0),
    _nccl("ncclCommDestroy", "nccl_comm_arg0"),
    _nccl("ncclCommAbort", "nccl_comm_arg0"),
)

MAX_SLOTS = 320  # keep equal to EACGM_PROBE_SLOTS passed by bpf_program.py
TORCH_SLOTS = range(64, MAX_SLOTS)  # discovered ATen operators; the catalog rows stay below 64


def torch_spec(name: str, overload: str) -> ProbeSpec:
    """The probe row of one ATen operator (span name aten::<op>)."""
    return ProbeSpec(Family.TORCH, Layer.TORCH, name, "no_args", has_return=False, exit_probes=True,
                     returns_status=False,
                     attributes=(("torch.op.name", name), ("torch.op.overload", overload)))


def enabled_rows(*, layers: frozenset[Layer], launch_layer: Layer) -> list[tuple[int, ProbeSpec]]:
    """Catalog rows to attach, with their slots.

    Launches are traced at exactly one layer: every runtime launch reaches cuLaunchKernel(Ex)
    in the driver, so probing both would cost two probe hits per launch and count it twice.
    A layer's name records are needed only when launches are traced at that layer.
    """
    if launch_layer not in (Layer.CUDA_RUNTIME, Layer.CUDA_DRIVER):
        raise ValueError(f"launch_layer {launch_layer.value!r} must be cuda.runtime or cuda.driver")
    rows = []
    for slot, spec in enumerate(CATALOG):
        if spec.layer not in layers:
            continue
        if spec.role is Role.LAUNCH and spec.layer is not launch_layer:
            continue
        if spec.role is Role.NAME_RECORD and spec.layer is not launch_layer:
            continue
        rows.append((slot, spec))
    return rows
