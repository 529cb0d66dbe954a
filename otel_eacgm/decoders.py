"""Argument decoders: one function per catalog ``decoder`` name, call record -> span attributes.

A decoder is registered in one place, its ``@decoder`` line, with what it needs (state kept
across calls, the probed symbol's name).

Argument indexes follow the x86-64 SysV ABI as captured by calls.bpf.c: args[0..5] are the
integer registers, args[6..9] the stack slots after the return address. Structs of up to 16
bytes passed by value (dim3) occupy registers: a dim3 is {x | y << 32} then {z}.
Every decoded value gets its own typed attribute (docs/semantic-conventions.md).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from typing import TypeVar

from otel_eacgm.cuda_enums import CUDA_MEMCPY_KINDS, NCCL_DATATYPES, NCCL_REDUCE_OPS
from otel_eacgm.events import CallEvent, CallFlags
from otel_eacgm.kernel_names import KernelNames

Attributes = dict[str, object]

_U32 = 0xFFFFFFFF
_MAX_TRACKED_ALLOCATIONS = 1 << 20


@dataclasses.dataclass
class DecodeContext:
    """State decoders share across calls: kernel names and live allocation sizes."""

    kernel_names: KernelNames
    allocations: dict[tuple[int, int], int] = dataclasses.field(default_factory=dict)


_Fn = TypeVar("_Fn", bound=Callable[..., Attributes])


@dataclasses.dataclass(frozen=True)
class Registered:
    """A decoder, and what the rest of the agent must know of it."""

    decode: Callable[..., Attributes]
    stateful: bool
    """It keeps state that later spans need (allocation sizes, communicator sizes), so its calls
    reach the agent whether sampled or not (catalog ProbeSpec.always_send)."""
    symbol_aware: bool
    """It serves several functions and takes the probed symbol's name (``symbol=``)."""


#: The decoder table: catalog ``decoder`` name -> decoder. Filled by @decoder, the one place a
#: decoder is registered.
DECODERS: dict[str, Registered] = {}


def decoder(*, stateful: bool = False, symbol_aware: bool = False) -> Callable[[_Fn], _Fn]:
    """Register the decorated function under its name in DECODERS."""

    def register(fn: _Fn) -> _Fn:
        DECODERS[fn.__name__] = Registered(fn, stateful, symbol_aware)
        return fn

    return register


def _signed32(v: int) -> int:
    v &= _U32
    return v - (1 << 32) if v & 0x80000000 else v


def _hex(v: int) -> str:
    return f"0x{v:x}"


def _dim3_regs(xy: int, z: int) -> list[int]:
    return [xy & _U32, (xy >> 32) & _U32, z & _U32]


def _launch_attrs(name: str, grid: list[int], block: list[int], smem: int, stream: int) -> Attributes:
    return {
        "cuda.kernel.name": name,
        "cuda.grid": grid,
        "cuda.block": block,
        "cuda.shared_mem.bytes": smem,
        "cuda.stream": _hex(stream),
    }


@decoder()
def rt_launch(ev: CallEvent, _s: bytes | None, ctx: DecodeContext) -> Attributes:
    """cudaLaunchKernel(func, dim3 grid, dim3 block, void **args, size_t smem, cudaStream_t)."""
    a = ev.args
    name = ctx.kernel_names.for_address(ev.pid, a[0])
    return _launch_attrs(name, _dim3_regs(a[1], a[2]), _dim3_regs(a[3], a[4]), a[6], a[7])


@decoder()
def rt_launch_ex(ev: CallEvent, _s: bytes | None, ctx: DecodeContext) -> Attributes:
    """cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)."""
    name = ctx.kernel_names.for_address(ev.pid, ev.args[1])
    gx, gy, gz, bx, by, bz, smem, stream = struct.unpack_from("<6IQQ", bytes(ev.deref))
    return _launch_attrs(name, [gx, gy, gz], [bx, by, bz], smem, stream)


@decoder()
def drv_launch(ev: CallEvent, _s: bytes | None, ctx: DecodeContext) -> Attributes:
    """cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra)."""
    a = ev.args
    name = ctx.kernel_names.for_handle(ev.pid, a[0])
    grid = [a[1] & _U32, a[2] & _U32, a[3] & _U32]
    block = [a[4] & _U32, a[5] & _U32, a[6] & _U32]
    return _launch_attrs(name, grid, block, a[7] & _U32, a[8])


@decoder()
def drv_launch_ex(ev: CallEvent, _s: bytes | None, ctx: DecodeContext) -> Attributes:
    """cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)."""
    name = ctx.kernel_names.for_handle(ev.pid, ev.args[1])
    gx, gy, gz, bx, by, bz, smem, _pad, stream = struct.unpack_from("<7IIQ", bytes(ev.deref))
    return _launch_attrs(name, [gx, gy, gz], [bx, by, bz], smem, stream)


@decoder()
def name_record(ev: CallEvent, s: bytes | None, ctx: DecodeContext) -> Attributes:
    """cuModuleGetFunction / cuLibraryGetKernel(handle *out, module, const char *name)."""
    raw = (s or b"").split(b"\0", 1)[0].decode(errors="replace")
    if ev.ret == 0 and ev.out_value and raw:
        ctx.kernel_names.record(ev.pid, ev.out_value, raw)
    return {"cuda.kernel.name": ctx.kernel_names.for_handle(ev.pid, ev.out_value) if ev.ret == 0 and raw else raw}


@decoder()
def kernel_get_function(ev: CallEvent, _s: bytes | None, ctx: DecodeContext) -> Attributes:
    """cuKernelGetFunction(CUfunction *out, CUkernel kernel)."""
    if ev.ret == 0 and ev.out_value:
        ctx.kernel_names.alias(ev.pid, ev.out_value, ev.args[1])
    return {"cuda.kernel.name": ctx.kernel_names.for_handle(ev.pid, ev.args[1])}


@decoder()
def get_kernel(ev: CallEvent, _s: bytes | None, ctx: DecodeContext) -> Attributes:
    """__cudaGetKernel(cudaKernel_t *out, const void *host_stub): the handle takes the stub's name."""
    if ev.ret == 0 and ev.out_value:
        ctx.kernel_names.alias_address(ev.pid, ev.out_value, ev.args[1])
    return {"cuda.kernel.name": ctx.kernel_names.for_address(ev.pid, ev.args[1])}


@decoder()
def graph_launch(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """cudaGraphLaunch / cuGraphLaunch(graphExec, stream)."""
    return {"cuda.graph.exec": _hex(ev.args[0]), "cuda.stream": _hex(ev.args[1])}


def _remember(ctx: DecodeContext, ev: CallEvent, size: int) -> None:
    if ev.ret == 0 and ev.out_value and len(ctx.allocations) < _MAX_TRACKED_ALLOCATIONS:
        ctx.allocations[(ev.pid, ev.out_value)] = size


@decoder(stateful=True)
def malloc(ev: CallEvent, _s: bytes | None, ctx: DecodeContext) -> Attributes:
    """cudaMalloc(void **ptr, size_t size) / cuMemAlloc_v2(CUdeviceptr *ptr, size_t size)."""
    _remember(ctx, ev, ev.args[1])
    attrs: Attributes = {"cuda.memory.bytes": ev.args[1]}
    if ev.ret == 0 and ev.flags & CallFlags.OUT:
        attrs["cuda.memory.address"] = _hex(ev.out_value)
    return attrs


@decoder(stateful=True)
def malloc_async(ev: CallEvent, s: bytes | None, ctx: DecodeContext) -> Attributes:
    """cudaMallocAsync(void **ptr, size_t size, cudaStream_t) / cuMemAllocAsync."""
    return malloc(ev, s, ctx) | {"cuda.stream": _hex(ev.args[2])}


@decoder(stateful=True)
def free(ev: CallEvent, _s: bytes | None, ctx: DecodeContext) -> Attributes:
    """cudaFree(void *ptr) / cuMemFree_v2: the size comes from the matching allocation."""
    attrs: Attributes = {"cuda.memory.address": _hex(ev.args[0])}
    size = ctx.allocations.pop((ev.pid, ev.args[0]), None) if ev.ret == 0 else ctx.allocations.get((ev.pid, ev.args[0]))
    if size is not None:
        attrs["cuda.memory.bytes"] = size
    return attrs


@decoder(stateful=True)
def free_async(ev: CallEvent, s: bytes | None, ctx: DecodeContext) -> Attributes:
    """cudaFreeAsync(void *ptr, cudaStream_t) / cuMemFreeAsync."""
    return free(ev, s, ctx) | {"cuda.stream": _hex(ev.args[1])}


@decoder()
def memcpy(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """cudaMemcpy(dst, src, size_t count, cudaMemcpyKind kind)."""
    kind = ev.args[3] & _U32
    return {"cuda.memory.bytes": ev.args[2], "cuda.memcpy.kind": CUDA_MEMCPY_KINDS.get(kind, f"kind{kind}")}


@decoder()
def memcpy_async(ev: CallEvent, s: bytes | None, ctx: DecodeContext) -> Attributes:
    """cudaMemcpyAsync(dst, src, count, kind, stream)."""
    return memcpy(ev, s, ctx) | {"cuda.stream": _hex(ev.args[4])}


_DRIVER_COPY_KINDS = {
    "cuMemcpyHtoDAsync_v2": "HostToDevice",
    "cuMemcpyDtoHAsync_v2": "DeviceToHost",
    "cuMemcpyDtoDAsync_v2": "DeviceToDevice",
    "cuMemcpyAsync": "Default",
}


@decoder(symbol_aware=True)
def drv_memcpy_async(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext, *, symbol: str = "cuMemcpyAsync") -> Attributes:
    """cuMemcpy*Async(dst, src, size_t bytes, CUstream): the kind is in the function's name."""
    return {"cuda.memory.bytes": ev.args[2], "cuda.memcpy.kind": _DRIVER_COPY_KINDS.get(symbol, "Default"), "cuda.stream": _hex(ev.args[3])}


@decoder()
def memset(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """cudaMemset(ptr, int value, size_t count)."""
    return {"cuda.memory.bytes": ev.args[2], "cuda.memory.address": _hex(ev.args[0])}


@decoder()
def memset_async(ev: CallEvent, s: bytes | None, ctx: DecodeContext) -> Attributes:
    """cudaMemsetAsync(ptr, value, count, stream)."""
    return memset(ev, s, ctx) | {"cuda.stream": _hex(ev.args[3])}


@decoder()
def stream_arg0(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """cudaStreamSynchronize(stream) / cuStreamSynchronize(stream)."""
    return {"cuda.stream": _hex(ev.args[0])}


@decoder()
def no_args(_ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """Calls without arguments worth recording (cudaDeviceSynchronize, ncclGroupStart)."""
    return {}


@decoder()
def event_sync(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """cudaEventSynchronize(event)."""
    return {"cuda.event": _hex(ev.args[0])}


@decoder()
def stream_wait_event(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """cudaStreamWaitEvent(stream, event, flags)."""
    return {"cuda.stream": _hex(ev.args[0]), "cuda.event": _hex(ev.args[1])}


@decoder()
def set_device(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """cudaSetDevice(int device)."""
    return {"cuda.device.id": _signed32(ev.args[0])}


def _nccl_common(collective: str, count: int, datatype: int, comm: int, stream: int) -> Attributes:
    datatype &= _U32
    name, size = NCCL_DATATYPES.get(datatype, (f"type{datatype}", 0))
    attrs: Attributes = {
        "nccl.collective": collective,
        "nccl.count": count,
        "nccl.datatype": name,
        "nccl.comm": _hex(comm),
        "cuda.stream": _hex(stream),
    }
    if size:
        attrs["nccl.bytes"] = count * size
    return attrs


def _op(v: int) -> str:
    v &= _U32
    return NCCL_REDUCE_OPS.get(v, f"op{v}")


@decoder(symbol_aware=True)
def nccl_allreduce(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext, *, symbol: str = "ncclAllReduce") -> Attributes:
    """ncclAllReduce / ncclReduceScatter(send, recv, count, datatype, op, comm, stream)."""
    a = ev.args
    return _nccl_common(symbol.removeprefix("nccl"), a[2], a[3], a[5], a[6]) | {"nccl.reduce_op": _op(a[4])}


@decoder()
def nccl_reduce(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """ncclReduce(send, recv, count, datatype, op, int root, comm, stream)."""
    a = ev.args
    return _nccl_common("Reduce", a[2], a[3], a[6], a[7]) | {"nccl.reduce_op": _op(a[4]), "nccl.root": _signed32(a[5])}


@decoder()
def nccl_broadcast(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """ncclBroadcast(send, recv, count, datatype, int root, comm, stream)."""
    a = ev.args
    return _nccl_common("Broadcast", a[2], a[3], a[5], a[6]) | {"nccl.root": _signed32(a[4])}


@decoder()
def nccl_bcast(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """ncclBcast(buff, count, datatype, int root, comm, stream) (in-place broadcast)."""
    a = ev.args
    return _nccl_common("Broadcast", a[1], a[2], a[4], a[5]) | {"nccl.root": _signed32(a[3])}


@decoder()
def nccl_allgather(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """ncclAllGather(send, recv, sendcount, datatype, comm, stream): bytes sent per rank."""
    a = ev.args
    return _nccl_common("AllGather", a[2], a[3], a[4], a[5])


@decoder()
def nccl_alltoall(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """ncclAlltoAll(send, recv, count, datatype, comm, stream): count per peer."""
    a = ev.args
    return _nccl_common("AlltoAll", a[2], a[3], a[4], a[5])


@decoder(symbol_aware=True)
def nccl_p2p(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext, *, symbol: str = "ncclSend") -> Attributes:
    """ncclSend / ncclRecv(buff, count, datatype, int peer, comm, stream)."""
    a = ev.args
    return _nccl_common(symbol.removeprefix("nccl"), a[1], a[2], a[4], a[5]) | {"nccl.peer": _signed32(a[3])}


@decoder(stateful=True)
def nccl_comm_init(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """ncclCommInitRank(Config)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, ...).

    The 128-byte ncclUniqueId goes on the stack by value, so rank is the third register.
    """
    attrs: Attributes = {"nccl.nranks": _signed32(ev.args[1]), "nccl.rank": _signed32(ev.args[2])}
    if ev.ret == 0 and ev.flags & CallFlags.OUT:
        attrs["nccl.comm"] = _hex(ev.out_value)
    return attrs


@decoder()
def nccl_comm_arg0(ev: CallEvent, _s: bytes | None, _ctx: DecodeContext) -> Attributes:
    """ncclCommDestroy / ncclCommAbort(ncclComm_t comm)."""
    return {"nccl.comm": _hex(ev.args[0])}
