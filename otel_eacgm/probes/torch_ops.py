"""PyTorch operators: which ``at::_ops::<op>::call`` entry points a libtorch_cpu.so exports.

Every ATen operator has a generated struct ``at::_ops::<name>`` whose static ``call`` is the
dispatcher entry for CPU and CUDA tensors alike (Python bindings and C++ callers go through it;
dispatcher-internal redispatches do not, so a call is seen once). The struct name is torchgen's
"unambiguous name": the operator name, plus ``_<overload>`` when there is an overload. The
library's own schema strings (``"add.Tensor(Tensor self, ...) -> Tensor"``) give the split back
into operator and overload, so nothing here is tied to one torch build.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import logging
import re
from collections.abc import Iterable, Sequence

from otel_eacgm.demangle import demangle
from otel_eacgm.probes.elf import ElfFile

log = logging.getLogger(__name__)

_CALL_SYMBOL = re.compile(r"^_ZN2at4_ops(\d+)(\w+)$")
_SCHEMA = re.compile(rb"\0([a-z_][a-z0-9_]*)(?:\.([A-Za-z0-9_]+))?\([^\0]*\) -> ")

# Operators that carry the time of common models, as fnmatch patterns on the operator name
# (``addmm``) or name.overload (``add.Tensor``). Order is priority when the cap bites: the
# compute of each model family first (recurrent, matrix products, attention, convolution,
# normalization, embedding, loss, optimizer), then the backward of each, then elementwise and
# copy operators, then any other backward. tests/test_torch_op_coverage.py checks, with
# torch.profiler on small models of each family, that the operators probed by default (cap
# included) hold the time of their steps.
DEFAULT_INCLUDE: tuple[str, ...] = (
    # recurrent: the layer call (lstm, gru, rnn_tanh), its cells and the fused/backend kernels
    "lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "mkldnn_rnn_layer", "_cudnn_rnn", "miopen_rnn",
    "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm", "linear", "_addmm_activation",
    "scaled_dot_product_attention", "_scaled_dot_product_*attention*", "_flash_attention_forward",
    "_efficient_attention_forward", "_native_multi_head_attention", "_transformer_encoder_layer_fwd",
    "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose*", "cudnn_convolution*",
    "mkldnn_convolution", "_slow_conv2d_forward", "max_pool2d", "max_pool2d_with_indices", "avg_pool2d",
    "adaptive_avg_pool2d", "_adaptive_avg_pool2d",
    "layer_norm", "native_layer_norm", "batch_norm", "native_batch_norm", "_native_batch_norm_legit*",
    "_batch_norm_impl_index", "cudnn_batch_norm", "group_norm", "native_group_norm", "rms_norm", "_fused_rms_norm",
    "instance_norm",
    "embedding", "embedding_bag", "_embedding_bag",
    "cross_entropy_loss", "nll_loss", "nll_loss_nd", "nll_loss2d", "nll_loss_forward", "nll_loss2d_forward",
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy*", "kl_div", "ctc_loss",
    "softmax", "_softmax", "log_softmax", "_log_softmax",
    # optimizers (SGD, Adam, AdamW, their foreach and fused forms) and gradient clipping
    "_foreach_add_", "_foreach_sub_", "_foreach_mul_", "_foreach_div_", "_foreach_addcmul_", "_foreach_addcdiv_",
    "_foreach_lerp_", "_foreach_sqrt", "_foreach_maximum_", "_foreach_neg", "_foreach_norm", "_foreach_zero_",
    "_foreach_copy_", "lerp_", "addcmul_", "addcdiv_", "sqrt", "maximum", "_fused_adam", "_fused_adam_", "_fused_adamw", "_fused_adamw_", "_fused_sgd", "_fused_sgd_",
    # the backward of the families above
    "mkldnn_rnn_layer_backward", "_cudnn_rnn_backward", "miopen_rnn_backward", "_thnn_fused_*_backward*",
    "_thnn_differentiable_*_backward",
    "convolution_backward", "_slow_conv2d_backward", "mkldnn_convolution_backward",
    "_scaled_dot_product_*attention*_backward", "_flash_attention_backward", "_efficient_attention_backward",
    "native_layer_norm_backward", "native_batch_norm_backward", "_batch_norm_impl_index_backward",
    "cudnn_batch_norm_backward", "native_group_norm_backward", "_fused_rms_norm_backward",
    "embedding_backward", "embedding_dense_backward", "_embedding_bag_backward", "_embedding_bag_dense_backward",
    "nll_loss_backward", "nll_loss2d_backward", "mse_loss_backward", "smooth_l1_loss_backward",
    "huber_loss_backward", "binary_cross_entropy_backward", "binary_cross_entropy_with_logits_backward",
    "_softmax_backward_data", "_log_softmax_backward_data", "max_pool2d_with_indices_backward",
    "_adaptive_avg_pool2d_backward", "threshold_backward", "sigmoid_backward", "tanh_backward", "gelu_backward",
    "silu_backward", "native_dropout_backward",
    # activations, elementwise and reductions, copies
    "dropout", "native_dropout", "relu", "relu_", "gelu", "silu", "sigmoid", "tanh",
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_",
    "sum", "mean", "amax", "max", "argmax",
    "copy_", "to", "_to_copy", "clone", "contiguous", "cat", "stack",
    # any other backward and foreach operator, last
    "*_backward", "*_backward_data", "_foreach_*",
)
DEFAULT_EXCLUDE: tuple[str, ...] = ("*.out", "*.out_*", "*_out", "*.*_out")  # out= variants


@dataclasses.dataclass(frozen=True)
class TorchOp:
    """One operator entry point in one library file."""

    name: str        # "aten::addmm"
    overload: str    # "" or "Tensor"
    struct: str      # torchgen's unambiguous name: "add_Tensor"
    symbol: str      # mangled symbol of ::call
    vaddr: int       # symbol value (virtual address in the file)
    file_offset: int
    exits: tuple[int, ...] = ()  # file offsets of its return instructions and tail jumps
    size: int = 0

    @property
    def qualified(self) -> str:
        """name.overload as PyTorch prints schemas (aten::add.Tensor)."""
        return f"{self.name}.{self.overload}" if self.overload else self.name


def _split_struct(struct: str, schemas: dict[str, tuple[str, str]]) -> tuple[str, str]:
    if struct in schemas:
        return schemas[struct]
    return struct, ""  # no schema string found: the struct name is the best name there is


@functools.lru_cache(maxsize=8)
def _discover(path: str, file_key: tuple[int, int]) -> tuple[TorchOp, ...]:
    del file_key  # part of the cache key only: a replaced file is read again
    with ElfFile(path) as elf:
        schemas: dict[str, tuple[str, str]] = {}
        for m in _SCHEMA.finditer(elf.section_bytes(".rodata")):
            op, overload = m.group(1).decode(), (m.group(2) or b"").decode()
            schemas[f"{op}_{overload}" if overload else op] = (op, overload)
        ops = []
        for symbol, vaddr, size in elf.dynamic_functions(b"_ZN2at4_ops"):
            m = _CALL_SYMBOL.match(symbol)
            if not m:
                continue
            n, rest = int(m.group(1)), m.group(2)
            struct, tail = rest[:n], rest[n:]
            if not tail.startswith("4callE"):
                continue
            if "::call(" not in demangle(symbol):  # cross-check the length-prefixed parse
                continue
            op, overload = _split_struct(struct, schemas)
            ops.append(TorchOp(f"aten::{op}", overload, struct, symbol, vaddr, elf.file_offset(vaddr), (), size))
    log.info("%s: %d operator entry points (%d schema strings)", path, len(ops), len(schemas))
    return tuple(sorted(ops, key=lambda o: o.struct))


def discover(path: str, file_key: tuple[int, int] = (0, 0)) -> tuple[TorchOp, ...]:
    """Every ``at::_ops::<op>::call`` of the library at `path` (cached per file)."""
    return _discover(path, file_key)


class NoExits(ValueError):
    """A function's exits could not be found (it would be left without return probes)."""


def with_exits(path: str, ops: Sequence[TorchOp]) -> list[TorchOp]:
    """`ops` with the file offsets of their exits: every ``ret`` and every jump to another
    exported function (a tail call). Jumps to the function's cold part (exception landing pads,
    split off by the compiler) are not exits.

    Returns are probed there, not with uretprobes: a uretprobe replaces the return address,
    and a C++ exception unwinding through that frame (a shape error raised by an operator and
    caught in Python) then finds no unwind information and terminates the process. Ops whose
    exits cannot be decoded are left out (logged).
    """
    try:
        import capstone  # type: ignore[import-not-found]
    except ImportError as exc:
        raise NoExits(f"the capstone disassembler is needed to find operator returns ({exc}); pip install capstone") from None
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    out = []
    with ElfFile(path) as elf:
        starts = {vaddr for _, vaddr, _ in elf.dynamic_functions()}
        for op in ops:
            exits, end = [], op.vaddr + op.size
            decoded = op.vaddr
            for ins in md.disasm(elf.read(op.vaddr, op.size), op.vaddr):
                decoded = ins.address + ins.size
                if ins.mnemonic == "ret":
                    exits.append(ins.address)
                elif ins.mnemonic == "jmp" and ins.op_str.startswith("0x"):
                    target = int(ins.op_str, 16)
                    if not op.vaddr <= target < end and target in starts:
                        exits.append(ins.address)
            if not exits or decoded != end:
                log.info("%s: %s left out: its exits could not be decoded (%d exits, decoded %d of %d bytes)",
                         path, op.qualified, len(exits), decoded - op.vaddr, op.size)
                continue
            out.append(dataclasses.replace(op, exits=tuple(elf.file_offset(a) for a in exits)))
    return out


def _pattern_index(op: TorchOp, patterns: Sequence[str]) -> int | None:
    base = op.name.removeprefix("aten::")
    names = (base, f"{base}.{op.overload}" if op.overload else base, op.name, op.qualified)
    for i, pattern in enumerate(patterns):
        if any(fnmatch.fnmatchcase(n, pattern.removeprefix("aten::")) or fnmatch.fnmatchcase(n, pattern)
               for n in names):
            return i
    return None


def select(ops: Iterable[TorchOp], include: Sequence[str], exclude: Sequence[str],
           cap: int) -> tuple[list[TorchOp], int]:
    """The operators to probe: matching `include`, not `exclude`, at most `cap`.

    Order is the include patterns' order (earlier patterns first), then name, so the cap drops
    the operators the configuration lists last. Returns (selected, dropped by the cap).
    """
    ranked = []
    for op in ops:
        rank = _pattern_index(op, include)
        if rank is None or _pattern_index(op, exclude) is not None:
            continue
        ranked.append((rank, op.struct, op))
    ranked.sort(key=lambda r: (r[0], r[1]))
    chosen = [op for _, _, op in ranked[:max(cap, 0)]]
    return chosen, max(len(ranked) - len(chosen), 0)
