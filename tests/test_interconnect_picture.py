"""The interconnect picture: each path's time from the link presets, and a redraw per choice."""

import pytest

from course_lib.perf.interconnect import INFINIBAND_NDR, NVLINK_4, PCIE_GEN5, get_link
from course_lib.perf.units import MiB
from course_lib.widgets.interconnect_picture import (
    BOUNCE_PATH,
    NVLINK_PATH,
    PATHS,
    RDMA_PATH,
    InterconnectPicture,
    path_time,
)


def test_path_times_are_alpha_plus_k_beta_per_hop():
    size = 64 * MiB
    nvlink, network, pcie = get_link(NVLINK_4), get_link(INFINIBAND_NDR), get_link(PCIE_GEN5)
    assert path_time(NVLINK_PATH, size) == pytest.approx(1e-6 + size / 450e9)
    assert path_time(RDMA_PATH, size) == pytest.approx(5e-6 + size / 50e9)
    assert path_time(BOUNCE_PATH, size) == pytest.approx(network.time(size) + 2 * pcie.time(size))
    assert path_time(NVLINK_PATH, size) < path_time(RDMA_PATH, size) < path_time(BOUNCE_PATH, size)
    assert 8 < path_time(RDMA_PATH, size) / nvlink.time(size) < 10  # NVLink 4 is 9x one NDR NIC each way
    with pytest.raises(ValueError, match="choose one of"):
        path_time("carrier pigeon", size)


def test_each_path_redraws_the_picture_and_bolds_its_row():
    picture = InterconnectPicture()
    pictures = {bytes(picture.figure.value)}
    for path in PATHS[1:]:
        picture.path.value = path
        assert f"<b>{path}</b>" in picture.readout.value
        pictures.add(bytes(picture.figure.value))
    assert len(pictures) == len(PATHS)
    picture.message.value = MiB
    assert "One message of 1 MiB" in picture.readout.value


def test_the_message_slider_reads_in_the_unit_it_shows_and_times_fit_their_unit():
    """It was labelled 'message (MiB)' while reading '1.0 KiB', and gave 1 GiB as '55,040.3 µs'."""
    picture = InterconnectPicture()
    assert "MiB" not in picture.message.description
    assert picture.message.options[0] == ("1 KiB", 1024) and picture.message.options[-1] == ("1 GiB", 2**30)
    picture.path.value = BOUNCE_PATH
    picture.message.value = 2**30
    assert f"<b>{BOUNCE_PATH}</b></td><td style='text-align:right; padding: 0 1em'>55 ms</td>" in picture.readout.value
    assert "µs" not in picture.readout.value
