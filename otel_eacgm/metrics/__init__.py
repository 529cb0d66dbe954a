"""Agent metrics: call statistics, NVML GPU counters, network counters."""
