"""GPUs the dry run can compile for without having one: public hardware facts -> XLA target configs.

XLA's GPU compiler runs on a CPU-only machine when it is told the device it compiles for, as the text
of a `stream_executor.GpuTargetConfigProto` (`jax.experimental.topologies.get_topology_desc(
platform="cuda", target_config=...)`). We write that text from a small table of facts NVIDIA publishes
(datasheets and the CUDA programming guide's per-compute-capability limits); the compiler uses them for
its cost model (SM count, clocks, bandwidth, L2), for kernel limits (threads, registers, shared memory)
and for the instruction set (compute capability). Nothing here is copied from XLA's own spec files.
"""

from __future__ import annotations

import dataclasses

# Limits that are the same on every target below (CUDA programming guide, "Compute capabilities" table,
# 8.0 and 9.0 columns).
THREADS_PER_BLOCK = 1024
THREADS_PER_WARP = 32
THREADS_PER_SM = 2048
REGISTERS_PER_SM = 65536  # 32-bit registers per SM; also the most one block may use
SHARED_MEMORY_PER_BLOCK = 48 * 1024  # without the opt-in
BLOCK_DIM_LIMITS = (2**31 - 1, 65535, 65535)  # x, y, z grid dimensions


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    """One GPU model's published facts (the sources are in `TARGETS`' comments)."""

    name: str  # the --dry_run_target value
    description: str  # the device name the CUDA driver reports
    compute_capability: tuple[int, int]
    sm_count: int
    fp32_cores_per_sm: int
    memory_bytes: int  # device memory as nvidia-smi reports it (MiB x 2^20)
    memory_bandwidth: int  # bytes/s, datasheet
    l2_cache_bytes: int
    boost_clock_ghz: float
    shared_memory_per_sm: int  # bytes
    shared_memory_per_block_optin: int  # bytes, the largest a kernel may opt in to


_MIB = 1 << 20
TARGETS: dict[str, GpuTarget] = {target.name: target for target in (
    # NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB: 2,039 GB/s) and architecture whitepaper
    # (108 SMs, 64 FP32 cores/SM, 40 MB L2, 1410 MHz boost, 164 KB shared memory per SM, 163 KB per block).
    GpuTarget("a100_80g", "NVIDIA A100-SXM4-80GB", (8, 0), 108, 64, 81920 * _MIB, 2_039_000_000_000,
              40 * _MIB, 1.41, 164 * 1024, 163 * 1024),
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5 80GB HBM3: 3.35 TB/s) and Hopper whitepaper (132 SMs,
    # 128 FP32 cores/SM, 50 MB L2, 1980 MHz boost, 228 KB shared memory per SM, 227 KB per block).
    GpuTarget("h100_80g", "NVIDIA H100 80GB HBM3", (9, 0), 132, 128, 81559 * _MIB, 3_350_000_000_000,
              50 * _MIB, 1.98, 228 * 1024, 227 * 1024),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM: 141 GB HBM3e at 4.8 TB/s); the same GH100 die and SM
    # configuration as the H100 SXM5.
    GpuTarget("h200", "NVIDIA H200", (9, 0), 132, 128, 143771 * _MIB, 4_800_000_000_000,
              50 * _MIB, 1.98, 228 * 1024, 227 * 1024),
)}


def get_target(name: str) -> GpuTarget:
    """The target called `name`; a one-line error listing the known ones otherwise."""
    if name not in TARGETS:
        raise ValueError(f"unknown GPU target {name!r}; expected one of {sorted(TARGETS)}")
    return TARGETS[name]


def target_config_text(target: GpuTarget) -> str:
    """The GpuTargetConfigProto text (protobuf text format) describing `target` to XLA's GPU compiler."""
    major, minor = target.compute_capability
    block_x, block_y, block_z = BLOCK_DIM_LIMITS
    device_info = {
        "threads_per_block_limit": THREADS_PER_BLOCK,
        "threads_per_warp": THREADS_PER_WARP,
        "shared_memory_per_block": SHARED_MEMORY_PER_BLOCK,
        "shared_memory_per_core": target.shared_memory_per_sm,
        "threads_per_core_limit": THREADS_PER_SM,
        "core_count": target.sm_count,
        "fpus_per_core": target.fp32_cores_per_sm,
        "block_dim_limit_x": block_x,
        "block_dim_limit_y": block_y,
        "block_dim_limit_z": block_z,
        "memory_bandwidth": target.memory_bandwidth,
        "l2_cache_size": target.l2_cache_bytes,
        "clock_rate_ghz": target.boost_clock_ghz,
        "device_memory_size": target.memory_bytes,
        "shared_memory_per_block_optin": target.shared_memory_per_block_optin,
        "registers_per_core_limit": REGISTERS_PER_SM,
        "registers_per_block_limit": REGISTERS_PER_SM,
    }
    lines = ["gpu_device_info {"]
    lines += [f"  {key}: {value}" for key, value in device_info.items()]
    lines += [f"  cuda_compute_capability {{ major: {major} minor: {minor} }}", "}",
              'platform_name: "CUDA"', f'device_description_str: "{target.description}"']
    return "\n".join(lines) + "\n"
