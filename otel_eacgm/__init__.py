"""otel-eacgm: non-instrumented tracing of CUDA, NCCL, PyTorch and Python calls with eBPF, exported over OTLP."""

__version__ = "0.1.0"
