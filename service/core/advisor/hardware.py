"""What one accelerator and its links can do, as the step-time model needs it.

The figures come from the vendors' spec sheets (dense 16-bit tensor throughput, HBM bandwidth,
NVLink per direction, PCIe generation) with the share a real workload reaches noted beside each;
a cluster profile may set its own (``peak_tflops``, ``memory_gb_per_s``, ``intra_node_gb_per_s``,
``inter_node_gb_per_s``, ``pcie_gb_per_s``) where its machines differ. An accelerator not in the
table gets the H100's figures. docs/advisor.md lists them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GB = 1e9


@dataclass(frozen=True)
class Hardware:
    """Per device: peak 16-bit FLOP/s, bytes/s of its memory, of the bus bandwidth of a ring
    collective within a node and across nodes, and of the host link (pinned copies)."""

    name: str
    peak_flops: float
    memory_bytes_per_s: float
    intra_node_bytes_per_s: float
    inter_node_bytes_per_s: float
    pcie_bytes_per_s: float


# Spec sheets. Collective bus bandwidth: NVLink per direction x 0.8 (NCCL all-reduce busbw on
# 8-GPU HGX boards reaches ~80% of it); inter-node: the NIC per GPU (400 Gb/s NDR on H100/H200,
# 200 Gb/s HDR on A100) x 0.8; PCIe: pinned host copies reach ~80% of the link (Gen5 x16 64 GB/s,
# Gen4 x16 32 GB/s).
ACCELERATORS: dict[str, Hardware] = {
    "h200": Hardware("h200", 989e12, 4.8e12, 0.8 * 450 * GB, 0.8 * 50 * GB, 0.8 * 64 * GB),
    "h100": Hardware("h100", 989e12, 3.35e12, 0.8 * 450 * GB, 0.8 * 50 * GB, 0.8 * 64 * GB),
    "a100": Hardware("a100", 312e12, 2.0e12, 0.8 * 300 * GB, 0.8 * 25 * GB, 0.8 * 32 * GB),
    # CPU ranks: one socket's AVX-512 bf16 order of magnitude, DDR bandwidth, gloo over loopback
    "cpu": Hardware("cpu", 1e12, 50 * GB, 5 * GB, 5 * GB, 50 * GB),
}
FALLBACK = "h100"


def hardware_for(
    accelerator: str,
    *,
    peak_tflops: float | None = None,
    memory_gb_per_s: float | None = None,
    intra_node_gb_per_s: float | None = None,
    inter_node_gb_per_s: float | None = None,
    pcie_gb_per_s: float | None = None,
) -> Hardware:
    """The table's entry for an accelerator name (``nvidia-h200-141gb`` -> h200), with the
    profile's own figures where it gives them."""
    name = accelerator.strip().lower()
    base = next((hw for key, hw in ACCELERATORS.items() if key in name), ACCELERATORS[FALLBACK])
    return replace(
        base,
        peak_flops=_scaled(peak_tflops, 1e12, base.peak_flops),
        memory_bytes_per_s=_scaled(memory_gb_per_s, GB, base.memory_bytes_per_s),
        intra_node_bytes_per_s=_scaled(intra_node_gb_per_s, GB, base.intra_node_bytes_per_s),
        inter_node_bytes_per_s=_scaled(inter_node_gb_per_s, GB, base.inter_node_bytes_per_s),
        pcie_bytes_per_s=_scaled(pcie_gb_per_s, GB, base.pcie_bytes_per_s),
    )


def _scaled(given: float | None, unit: float, default: float) -> float:
    return default if given is None else given * unit


DEFAULT_HARDWARE = ACCELERATORS[FALLBACK]
