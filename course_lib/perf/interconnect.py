"""The interconnect hierarchy of a GPU cluster as link presets: bandwidth and per-hop latency.

NVLink first, then PCIe and InfiniBand, which are of the same order: a NIC hangs off PCIe, and
NDR's 400 Gb/s was sized to match a Gen5 x16 slot (bandwidths per GPU, one direction unless marked):

  NVLink 4 (H100)        900 GB/s aggregate, both directions together: 18 links x 50 GB/s, so
                         450 GB/s each way (NVIDIA H100 SXM datasheet). NVLink 3 (A100) 600 GB/s,
                         NVLink 5 (B200) 1.8 TB/s aggregate. GPU to GPU inside one node, through
                         NVSwitch: every pair at full speed. Put tensor parallelism here.
  PCIe Gen5 x16          ~64 GB/s each way (32 GT/s x 16 lanes, 128b/130b coding: 63 GB/s);
  PCIe Gen4 x16          ~32 GB/s (16 GT/s: 31.5 GB/s). GPU to host and GPU to NIC: an order of
                         magnitude below NVLink.
  InfiniBand NDR         400 Gb/s per NIC = 50 GB/s (ConnectX-7, one NIC per GPU in DGX/HGX H100);
  InfiniBand HDR         200 Gb/s = 25 GB/s (ConnectX-6, DGX A100). Node to node, through a switch:
                         One NIC is 9x (NDR vs NVLink 4 each way) to 18x (vs its aggregate) slower
                         than one GPU's NVLink; with a NIC per GPU, a node's 8 NICs together carry
                         400 GB/s each way, close to one GPU's 450.

Latencies (``alpha_s``) are typical orders of magnitude, not measurements: about 1 us for an
NVLink hop, a few us for PCIe, about 5 us for an InfiniBand hop through a switch (NIC, switch
and software). With GPUDirect RDMA the NIC reads and writes GPU memory directly; without it
every inter-node message also crosses PCIe twice through a host buffer (``host_bounce_time``).
"""

from __future__ import annotations

from dataclasses import dataclass

from course_lib.checks import require_positive
from course_lib.perf.hardware import get_gpu


@dataclass(frozen=True)
class Link:
    """One hop of the hierarchy: ``alpha_s`` seconds of start-up, ``bandwidth`` bytes per
    second in one direction. ``scope`` is where it sits: "GPU to GPU in a node", "GPU to host
    or NIC" or "node to node"."""

    name: str
    alpha_s: float
    bandwidth: float
    scope: str = ""

    def __post_init__(self) -> None:
        require_positive("Link.alpha_s", self.alpha_s)
        require_positive("Link.bandwidth", self.bandwidth)

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1 / self.bandwidth

    def time(self, num_bytes: float) -> float:
        """alpha + K beta: one message of ``num_bytes`` over this link."""
        return self.alpha_s + num_bytes * self.beta


IN_NODE, HOST, ACROSS_NODES = "GPU to GPU in a node", "GPU to host or NIC", "node to node"

NVLINK_4 = "NVLink 4 (H100, within a node)"
PCIE_GEN4 = "PCIe Gen4 x16"
PCIE_GEN5 = "PCIe Gen5 x16"
INFINIBAND_HDR = "InfiniBand HDR 200 Gb/s (across nodes)"
INFINIBAND_NDR = "InfiniBand NDR 400 Gb/s (across nodes)"


def _links() -> dict[str, Link]:
    h100 = get_gpu("H100-80GB")
    return {link.name: link for link in (
        Link(NVLINK_4, 1e-6, h100.nvlink_bandwidth / 2, IN_NODE),  # 900 GB/s both ways -> 450 each way
        Link(PCIE_GEN5, 3e-6, h100.pcie_bandwidth, HOST),
        Link(PCIE_GEN4, 3e-6, 32e9, HOST),
        Link(INFINIBAND_NDR, 5e-6, h100.network_bandwidth, ACROSS_NODES),
        Link(INFINIBAND_HDR, 5e-6, 25e9, ACROSS_NODES),
    )}


LINKS: dict[str, Link] = _links()


def get_link(name: str) -> Link:
    """Look up a link preset by name; the error lists the known names."""
    try:
        return LINKS[name]
    except KeyError:
        raise KeyError(f"Unknown link {name!r}; choose one of {sorted(LINKS)}.") from None


def host_bounce_time(num_bytes: float, network: Link, pcie: Link) -> float:
    """Seconds to move ``num_bytes`` from a GPU in one node to a GPU in another without
    GPUDirect RDMA, unpipelined: GPU to host memory over PCIe, host to host over the network,
    host to GPU over PCIe. With GPUDirect RDMA it is ``network.time(num_bytes)``: the NIC reads
    the sender's GPU memory and writes the receiver's, and the host copies disappear."""
    return pcie.time(num_bytes) + network.time(num_bytes) + pcie.time(num_bytes)
