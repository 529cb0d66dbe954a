"""Names of CUDA and NCCL enum values that appear in call arguments and return codes.

Values come from the public headers (cuda_runtime_api.h / driver_types.h, cuda.h, nccl.h).
Codes not listed fall back to a readable "<prefix><N>" form instead of failing.
"""

from __future__ import annotations

CUDA_RUNTIME_ERRORS = {
    0: "cudaSuccess", 1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation",
    3: "cudaErrorInitializationError", 4: "cudaErrorCudartUnloading",
    9: "cudaErrorInvalidConfiguration", 12: "cudaErrorInvalidPitchValue",
    13: "cudaErrorInvalidSymbol", 17: "cudaErrorInvalidDevicePointer",
    21: "cudaErrorInvalidMemcpyDirection", 35: "cudaErrorInsufficientDriver",
    46: "cudaErrorDevicesUnavailable", 98: "cudaErrorInvalidDeviceFunction",
    100: "cudaErrorNoDevice", 101: "cudaErrorInvalidDevice", 200: "cudaErrorInvalidKernelImage",
    201: "cudaErrorDeviceUninitialized", 209: "cudaErrorNoKernelImageForDevice",
    400: "cudaErrorInvalidResourceHandle", 500: "cudaErrorSymbolNotFound",
    600: "cudaErrorNotReady", 700: "cudaErrorIllegalAddress",
    701: "cudaErrorLaunchOutOfResources", 702: "cudaErrorLaunchTimeout",
    709: "cudaErrorContextIsDestroyed", 710: "cudaErrorAssert", 719: "cudaErrorLaunchFailure",
    720: "cudaErrorCooperativeLaunchTooLarge", 900: "cudaErrorStreamCaptureUnsupported",
    999: "cudaErrorUnknown",
}

CUDA_DRIVER_ERRORS = {
    0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED", 100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE", 200: "CUDA_ERROR_INVALID_IMAGE",
    201: "CUDA_ERROR_INVALID_CONTEXT", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
    300: "CUDA_ERROR_INVALID_SOURCE", 400: "CUDA_ERROR_INVALID_HANDLE",
    500: "CUDA_ERROR_NOT_FOUND", 600: "CUDA_ERROR_NOT_READY", 700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", 702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    719: "CUDA_ERROR_LAUNCH_FAILED", 999: "CUDA_ERROR_UNKNOWN",
}

NCCL_RESULTS = {
    0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
    4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress",
}

# ncclDataType_t -> (name, bytes per element)
NCCL_DATATYPES = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8),
    5: ("uint64", 8), 6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8),
    9: ("bfloat16", 2), 10: ("float8e4m3", 1), 11: ("float8e5m2", 1),
}

NCCL_REDUCE_OPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}

CUDA_MEMCPY_KINDS = {
    0: "HostToHost", 1: "HostToDevice", 2: "DeviceToHost", 3: "DeviceToDevice", 4: "Default",
}


def error_name(table: dict[int, str], code: int, prefix: str) -> str:
    """Name of a return code, or ``prefix + code`` when the table does not know it."""
    return table.get(code, f"{prefix}{code}")
