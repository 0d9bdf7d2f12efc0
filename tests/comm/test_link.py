"""Modelled network link: unit parsing, cost formulas, and what the communicator does with them (1 process)."""
from __future__ import annotations

import time

import pytest
import torch

from hpc_graph.comm.link import LinkModel, parse_bandwidth, parse_latency


@pytest.mark.parametrize("text,bits", [("1Gb/s", 1e9), ("1 Gbit/s", 1e9), ("100Gbps", 100e9), ("10Mb/s", 1e7),
                                       ("12.5GB/s", 1e11), ("3e9", 3e9), (2.5e9, 2.5e9), (0, None),
                                       (None, None), ("800 Kbit/s", 8e5)])
def test_bandwidth_units(text, bits):
    got = parse_bandwidth(text)
    assert got == (None if bits is None else pytest.approx(bits))


@pytest.mark.parametrize("text,seconds", [("50us", 50e-6), ("50 µs", 50e-6), ("1.5ms", 1.5e-3), ("2e-6", 2e-6),
                                          (1e-5, 1e-5), ("3 s", 3.0), (None, 0.0), ("100ns", 1e-7)])
def test_latency_units(text, seconds):
    assert parse_latency(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", [-1, "-1Gb/s", "fast", "1 Gb/hour", float("inf"), True, [1]])
def test_bad_bandwidth_is_rejected_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"^comm\.link_bandwidth: "):
        parse_bandwidth(bad)


@pytest.mark.parametrize("bad", [-1e-6, "-5us", "soon", "5 minutes", float("nan"), False])
def test_bad_latency_is_rejected_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"^comm\.link_latency: "):
        parse_latency(bad)


def test_cost_formulas():
    link = LinkModel(bandwidth=8e6, latency=1e-3)  # 1 MB/s
    assert link.cost(1000, 500, 2) == pytest.approx(2e-3 + 1000 / 1e6)
    assert link.cost(500, 2000, 1) == pytest.approx(1e-3 + 2000 / 1e6)  # full duplex: the larger direction
    assert link.cost(100, 100, 0) == 0.0
    # ring all-reduce over 4 ranks: 6 steps of latency + nbytes / 4 / bandwidth
    assert link.allreduce_cost(4000, 4) == pytest.approx(6 * (1e-3 + 1000 / 1e6))
    assert link.allreduce_cost(4000, 1) == 0.0
    with pytest.raises(ValueError):
        LinkModel(bandwidth=0)


def test_single_process_communicator_models_nothing():
    from hpc_graph.comm import get_communicator

    comm = get_communicator("local")
    comm.set_link(LinkModel(bandwidth=8.0, latency=1.0))  # absurdly slow: any modelled op would take ages
    t0 = time.perf_counter()
    comm.allreduce_(torch.ones(1000))
    got = comm.exchange({0: torch.ones(10)}, {0: ((10,), torch.float32)})
    assert torch.equal(got[0], torch.ones(10))
    assert time.perf_counter() - t0 < 0.5 and comm.modeled_seconds == 0.0
    comm.set_link(None)
