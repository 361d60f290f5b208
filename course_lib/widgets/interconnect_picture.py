"""Two 8-GPU nodes as a picture: NVSwitch inside, PCIe to the NICs and the host, InfiniBand between.

Choose a path and a message size: the picture highlights the hops the message takes and the
readout gives its alpha-beta time from ``course_lib.perf.interconnect``'s presets.
"""

from __future__ import annotations

import ipywidgets as w
from matplotlib.patches import FancyBboxPatch

from course_lib.perf.interconnect import INFINIBAND_NDR, NVLINK_4, PCIE_GEN5, get_link, host_bounce_time
from course_lib.perf.units import MiB, format_bytes, format_duration
from course_lib.widgets.figure_pane import FigurePane, new_figure, one_at_a_time
from course_lib.widgets.selection_readout import with_readout

GPUS_PER_NODE = 8
NVLINK_PATH = "in a node: NVLink"
RDMA_PATH = "across nodes: GPUDirect RDMA"
BOUNCE_PATH = "across nodes: via host memory"
PATHS = (NVLINK_PATH, RDMA_PATH, BOUNCE_PATH)
HIGHLIGHT, QUIET = "#d62728", "#9e9e9e"


def path_time(path: str, num_bytes: float) -> float:
    """Seconds for one message of ``num_bytes`` along ``path`` (one of ``PATHS``)."""
    nvlink, network, pcie = get_link(NVLINK_4), get_link(INFINIBAND_NDR), get_link(PCIE_GEN5)
    if path == NVLINK_PATH:
        return nvlink.time(num_bytes)
    if path == RDMA_PATH:
        return network.time(num_bytes)
    if path == BOUNCE_PATH:
        return host_bounce_time(num_bytes, network, pcie)
    raise ValueError(f"Unknown path {path!r}; choose one of {PATHS}.")


def _box(ax, x, y, width, height, text, color, lit, fontsize=8.0):
    ax.add_patch(FancyBboxPatch((x, y), width, height, boxstyle="round,pad=0.02", linewidth=2 if lit else 0.8,
                                edgecolor=HIGHLIGHT if lit else "#424242", facecolor=color))
    ax.text(x + width / 2, y + height / 2, text, ha="center", va="center", fontsize=fontsize)


def _wire(ax, points, lit):
    xs, ys = zip(*points)
    ax.plot(xs, ys, color=HIGHLIGHT if lit else QUIET, lw=2.6 if lit else 1.0, zorder=0)


NODE_LEFT = (0.0, 11.4)  # x of each node's left edge
GPU_X0, GPU_STEP, GPU_W = 1.7, 1.0, 0.85


def draw_interconnect(path: str = NVLINK_PATH):
    """The two nodes with ``path``'s hops in red; bandwidths from the link presets. Each GPU and
    its NIC hang off one PCIe switch, which also leads to the CPU and host memory."""
    nvlink, network, pcie = get_link(NVLINK_4), get_link(INFINIBAND_NDR), get_link(PCIE_GEN5)
    fig = new_figure(11.5, 4.4)
    ax = fig.add_axes((0, 0, 1, 0.9))
    ax.set(xlim=(-0.3, 21.5), ylim=(-0.15, 6.3))
    ax.axis("off")
    inside, bounce = path == NVLINK_PATH, path == BOUNCE_PATH
    for node, left in enumerate(NODE_LEFT):
        ax.add_patch(FancyBboxPatch((left - 0.15, 1.35), 9.85, 4.9, boxstyle="round,pad=0.05",
                                    facecolor="#fafafa", edgecolor="#bdbdbd", zorder=-2))
        ax.text(left + 5.6, 5.95, f"node {node}", ha="center", fontsize=9, weight="bold")
        _box(ax, left + GPU_X0, 5.1, 7 * GPU_STEP + GPU_W, 0.45,
             f"NVSwitch: NVLink 4, {nvlink.bandwidth / 1e9:.0f} GB/s each way per GPU (900 GB/s both ways)",
             "#e3f2fd", inside and node == 0)
        _box(ax, left, 2.7, 1.4, 0.7, "CPU + host\nmemory", "#fff3e0", bounce)
        _wire(ax, [(left + 1.4, 3.05), (left + GPU_X0 + 7 * GPU_STEP, 3.05)], False)  # PCIe to the CPU
        _wire(ax, [(left + 1.4, 3.05), (left + GPU_X0, 3.05)], bounce)
        for gpu in range(GPUS_PER_NODE):
            x = left + GPU_X0 + gpu * GPU_STEP
            centre, first = x + GPU_W / 2, gpu == 0
            ends = (node == 0 and gpu in (0, 5)) if inside else first
            _box(ax, x, 3.75, GPU_W, 0.8, f"GPU {gpu}", "#e8f5e9", ends)
            _box(ax, x, 2.88, GPU_W, 0.34, "PCIe", "#eceff1", first and not inside, fontsize=8)
            _box(ax, x, 1.75, GPU_W, 0.5, f"NIC {gpu}", "#ede7f6", first and not inside, fontsize=8)
            _wire(ax, [(centre, 4.55), (centre, 5.1)], inside and ends)
            _wire(ax, [(centre, 3.75), (centre, 3.22)], first and not inside)
            _wire(ax, [(centre, 2.88), (centre, 2.25)], first and not inside)
        ax.text(left + GPU_X0 + 7 * GPU_STEP + GPU_W, 1.5, f"PCIe Gen5 x16: {pcie.bandwidth / 1e9:.0f} GB/s each way",
                ha="right", va="center", fontsize=8)
        if bounce:  # the copies through host memory, numbered in the order they happen
            gpu, host_top, host_bottom, nic = (left + GPU_X0, 4.15), (left + 0.7, 3.4), (left + 0.7, 2.7), \
                (left + GPU_X0, 2.0)
            hops = ((gpu, host_top, "1"), (host_bottom, nic, "2")) if node == 0 else \
                ((nic, host_bottom, "3"), (host_top, gpu, "4"))
            for start, end, number in hops:
                ax.annotate("", xy=end, xytext=start, arrowprops={"arrowstyle": "->", "color": HIGHLIGHT, "lw": 2,
                                                                   "connectionstyle": "arc3,rad=0.3"})
                ax.text((start[0] + end[0]) / 2 - (0.6 if node == 0 else 0.3), (start[1] + end[1]) / 2, number, fontsize=10,
                        weight="bold", color=HIGHLIGHT, ha="center", va="center")
    _box(ax, 9.95, 0.75, 1.2, 0.6, "InfiniBand\nswitch", "#f3e5f5", not inside)
    for left in NODE_LEFT:
        nic = left + GPU_X0 + GPU_W / 2
        _wire(ax, [(nic, 1.75), (nic, 1.05), (9.95 if left == 0 else 11.15, 1.05)], not inside)
    ax.text(10.55, 0.45, f"InfiniBand NDR 400 Gb/s: {network.bandwidth / 1e9:.0f} GB/s per NIC", ha="center",
            fontsize=9, color=HIGHLIGHT if not inside else "#616161")
    if bounce:
        ax.text(10.55, 0.05, "1 GPU to host memory, 2 the NIC reads it, 3 the other NIC writes host memory, "
                "4 host memory to GPU", ha="center", fontsize=8.5, color=HIGHLIGHT)
    fig.suptitle(f"Two 8-GPU nodes: {path}", fontsize=11)
    return fig


class InterconnectPicture(w.VBox):
    """A path chooser, a message-size slider, the picture and the message's modelled time."""

    def __init__(self, path: str = NVLINK_PATH, message_bytes: int = 64 * MiB) -> None:
        self.path = w.ToggleButtons(options=PATHS, value=path, style={"button_width": "230px"})
        self.message = w.SelectionSlider(options=[(format_bytes(2**k, whole=True), 2**k) for k in range(10, 31)],
                                         value=message_bytes, description="message size", continuous_update=False,
                                         layout=w.Layout(width="520px"), style={"description_width": "8em"})
        self.figure = FigurePane()
        self.readout = w.HTML()
        self.path.observe(self._redraw, "value")
        self.message.observe(self._redraw, "value")
        self._redraw()
        super().__init__([self.path, with_readout(self.message), self.readout, self.figure])

    @one_at_a_time
    def _redraw(self, *_) -> None:
        num_bytes = self.message.value
        times = {path: path_time(path, num_bytes) for path in PATHS}
        cell = "style='text-align:right; padding: 0 1em'"
        rows = "".join(f"<tr><td>{f'<b>{p}</b>' if p == self.path.value else p}</td>"
                       f"<td {cell}>{format_duration(t)}</td><td {cell}>{t / times[NVLINK_PATH]:.1f}x</td></tr>"
                       for p, t in times.items())
        self.readout.value = (f"<p>One message of {format_bytes(num_bytes, whole=True)}, alpha + K beta per hop:</p>"
                              f"<table><tr><th>path</th><th>time</th><th>vs NVLink</th></tr>{rows}</table>")
        self.figure.redraw(lambda: draw_interconnect(self.path.value))
