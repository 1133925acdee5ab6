"""The alpha-beta cost model: formulas, profiles, fitting."""

import math

import numpy as np
import pytest

from hpcopt.comm.core import OpCounter
from hpcopt.comm.costmodel import (
    MEMORY,
    NetworkProfile,
    NodeLayout,
    comm_modelled,
    fit_allreduce,
    get_profile,
    large_message_form,
    node_layout_of,
    predict_allreduce_seconds,
    profile_attrs,
    trace_modelled,
)
from hpcopt.errors import HpcoptError


def test_formulas():
    net = NetworkProfile("x", alpha=1e-6, beta=1e-9)
    assert net.p2p(1000) == pytest.approx(1e-6 + 1e-6)
    assert net.allreduce(8e6, 4, "ring") == pytest.approx(6e-6 + 1.5 * 8e6 * 1e-9)
    assert net.allreduce(8e6, 4, "tree") == pytest.approx(2 * (1e-6 + 8e6 * 1e-9))
    assert net.allreduce(8, 8, "auto") == net.allreduce(8, 8, "tree")      # latency bound
    assert net.allreduce(8e8, 8, "auto") == net.allreduce(8e8, 8, "ring")  # bandwidth bound
    assert net.allreduce(1e9, 1) == 0.0
    assert net.bandwidth == pytest.approx(1e9)


def test_named_and_custom_profiles():
    assert get_profile("ib100").bandwidth == pytest.approx(12.5e9)
    custom = get_profile("alpha=2e-6,bandwidth=5e9")
    assert (custom.alpha, custom.beta) == (2e-6, pytest.approx(2e-10))
    assert get_profile("alpha=1e-6,beta=1e-9").beta == 1e-9
    for bad in ("nonet", "alpha=x,beta=1", "alpha=1", "alpha=1,beta=1,bandwidth=2", "gamma=1,alpha=1,beta=1"):
        with pytest.raises(HpcoptError):
            get_profile(bad)
    with pytest.raises(HpcoptError):
        NetworkProfile("neg", -1.0, 1.0)


def test_fit_recovers_the_parameters_of_synthetic_measurements():
    true = NetworkProfile("t", alpha=3e-6, beta=1 / 6e9)
    sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]
    rng = np.random.default_rng(0)
    times = [true.allreduce(n, 2, "ring") * (1 + 0.01 * rng.standard_normal()) for n in sizes]
    fitted = fit_allreduce(sizes, times, ranks=2, algorithm="ring")
    assert fitted.alpha == pytest.approx(true.alpha, rel=0.1)
    assert fitted.beta == pytest.approx(true.beta, rel=0.05)
    with pytest.raises(HpcoptError):
        fit_allreduce([1], [1e-6], ranks=2)


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_a_fit_gives_the_measured_times_back_under_the_model_s_own_pricing(ranks):
    """Times with a latency of their own for small messages (recursive doubling, log2 p hops)
    and a ring's bandwidth for large ones: fitted under auto, the model prices the smallest
    size and the largest as measured. The ring-form fit (the fit before) priced a 2-rank
    allreduce one alpha low (auto takes the tree there) and small messages at 4 and 8 ranks
    at 1/3 and 3/14 of their time."""
    alpha, beta = 2e-3, 1e-8
    hops = math.ceil(math.log2(ranks))
    sizes = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
    times = [hops * (alpha + n * beta) if n < 256 << 10 else
             max(hops, 2 * (ranks - 1)) * alpha + 2 * (ranks - 1) / ranks * n * beta for n in sizes]
    fitted = fit_allreduce(sizes, times, ranks, bandwidth_from=256 << 10)
    assert fitted.allreduce(sizes[0], ranks) == pytest.approx(times[0], rel=0.02)
    assert fitted.allreduce(sizes[-1], ranks) == pytest.approx(times[-1], rel=0.1)
    assert large_message_form(ranks) == ("tree" if ranks == 2 else "ring")


def test_a_fit_with_the_node_layout_leaves_the_in_node_level_to_the_model():
    """Allreduces across 4 nodes of 2 ranks timed as the node-aware model prices them (in-node
    level on memory + nodes' level on the network): fitted with the layout, the network's alpha
    and beta come back and the model gives the times again; fitted without, the in-node level is
    counted in the network's beta and the model prices it twice."""
    network, memory = NetworkProfile("n", alpha=20e-6, beta=8e-9), NetworkProfile("m", 1e-3, 2e-9)
    layout = NodeLayout(4, 2, memory)
    sizes = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]
    times = [memory.allreduce(n, 2) + network.allreduce(n, 4) for n in sizes]
    fitted = fit_allreduce(sizes, times, 4, bandwidth_from=256 << 10, layout=layout)
    assert fitted.alpha == pytest.approx(network.alpha, rel=1e-6)
    assert fitted.beta == pytest.approx(network.beta)
    assert layout.spanning("allreduce", 1, 4 << 20, 8, fitted) == pytest.approx(times[-1])
    whole = fit_allreduce(sizes, times, 4, bandwidth_from=256 << 10)
    assert layout.spanning("allreduce", 1, 4 << 20, 8, whole) > 1.1 * times[-1]


def test_fitting_bandwidth_on_large_sizes_takes_the_latency_from_the_small_ones():
    """Large messages that show no latency (the pattern measured here: a shared-memory MPI
    switches protocol) and small ones that do: the two-stage fit keeps the large sizes'
    bandwidth and prices small messages by the small sizes' latency."""
    alpha, beta, ranks = 4e-6, 1 / 5e9, 4
    sizes = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
    times = [1.5 * n * beta + (6 * alpha if n < 256 << 10 else 0.0) for n in sizes]
    large_only = fit_allreduce(sizes[3:], times[3:], ranks)
    assert large_only.alpha < 1e-12 and large_only.beta == pytest.approx(beta, rel=1e-9)
    fitted = fit_allreduce(sizes, times, ranks, bandwidth_from=256 << 10, algorithm="ring")
    assert fitted.beta == pytest.approx(beta, rel=1e-9)
    assert fitted.alpha == pytest.approx(alpha, rel=1e-9)
    with pytest.raises(HpcoptError, match="from 1.67772e\\+07 bytes up"):
        fit_allreduce(sizes, times, ranks, bandwidth_from=16 << 20)


def test_prediction_for_a_run():
    net = get_profile("eth10")
    assert predict_allreduce_seconds(0, 0, 4, net) == 0.0
    one = net.allreduce(4e5, 4)
    assert predict_allreduce_seconds(10, 4e6, 4, net) == pytest.approx(10 * one)
    assert math.isfinite(one)


def test_every_comm_operation_has_a_cost():
    from hpcopt.comm import OpCounter
    from hpcopt.comm.costmodel import comm_modelled, main_ops, op_seconds

    net = NetworkProfile("x", alpha=1e-6, beta=1e-9)
    assert op_seconds("bcast", 2, 2000, 4, net) == pytest.approx(2 * 2 * (1e-6 + 1e-6))
    assert op_seconds("barrier", 3, 0, 4, net) == pytest.approx(3 * 2 * 1e-6)
    assert op_seconds("iallgather", 1, 24, 4, net) == pytest.approx(3 * (1e-6 + 24e-9))
    assert op_seconds("send", 2, 2000, 2, net) == pytest.approx(2 * (1e-6 + 1e-6))
    assert op_seconds("alltoall", 2, 6000, 4, net) == pytest.approx(2 * (3 * 1e-6 + 3000e-9))
    assert op_seconds("recv", 2, 2000, 2, net) == op_seconds("wait", 5, 0, 2, net) == 0.0
    assert op_seconds("allreduce", 1, 1e6, 1, net) == op_seconds("allreduce", 0, 0, 4, net) == 0.0
    counters = {("allreduce", "average"): OpCounter(4, 4000, 1.0), ("send", "p2p"): OpCounter(1, 8, 0.1),
                ("recv", "p2p"): OpCounter(1, 8, 0.1), ("iallgather", "trace"): OpCounter(2, 48, 0.0),
                ("wait", "trace"): OpCounter(2, 0, 0.0)}
    modelled = comm_modelled(counters, 2, net)
    assert modelled["average"] == pytest.approx(4 * net.allreduce(1000, 2))
    assert modelled["p2p"] == pytest.approx(net.p2p(8))
    assert main_ops(counters) == {"average": "allreduce", "p2p": "send", "trace": "iallgather"}


def test_projected_wall_swaps_measured_for_modelled_communication():
    from hpcopt.comm.costmodel import project_wall

    assert project_wall(np.array([10.0, 20.0]), np.array([2.0, 4.0]), np.array([5.0, 9.0])).tolist() == [13.0, 25.0]


def test_the_network_option_is_checked():
    from hpcopt.config import build_config

    assert build_config(None, {"network": "ib100"}).run.network == "ib100"
    assert build_config(None, {"network": "alpha=1e-6,bandwidth=1e9"}).run.network
    with pytest.raises(HpcoptError, match="unknown network profile"):
        build_config(None, {"network": "token-ring"})
    with pytest.raises(HpcoptError, match="data-parallel"):
        build_config(None, {"network": "eth10", "algorithm": "pprs"})


def test_the_node_layout_of_a_node_map():
    assert node_layout_of((0, 0, 1, 1)) == node_layout_of((0, 1, 0, 1)) == NodeLayout(2, 2)
    assert node_layout_of((0, 0, 0, 1, 1, 1)) == NodeLayout(2, 3)
    assert node_layout_of((0, 0, 0, 0)) is None  # one node: each rank priced as a node of its own
    attrs = profile_attrs(get_profile("eth10"), layout=NodeLayout(2, 2))
    assert (attrs["network_nodes"], attrs["network_per_node"]) == (2, 2)
    assert "network_nodes" not in profile_attrs(get_profile("eth10"))  # one node: as before


D = 4000


def counters() -> dict:
    """A 2 x 2 run: group rounds within the nodes; global averages and allgathers across them."""
    return {("allreduce", "group_average"): OpCounter(5, 5 * D, 0.1, 5, 5 * D),
            ("allreduce", "average"): OpCounter(3, 3 * D, 0.1, 0, 0),
            ("allgather", "wire"): OpCounter(2, 2 * D, 0.1, 0, 0),
            ("barrier", "start"): OpCounter(1, 0, 0.1, 1, 0)}


def test_without_nodes_every_call_is_priced_on_the_network_over_its_ranks():
    eth10 = get_profile("eth10")
    modelled = comm_modelled(counters(), 4, eth10, label_ranks={"group_average": 2})
    assert modelled["group_average"] == 5 * eth10.allreduce(D, 2)
    assert modelled["average"] == 3 * eth10.allreduce(D, 4)
    assert modelled["wire"] == 2 * 3 * eth10.p2p(D)


def test_on_nodes_in_node_calls_cost_memory_speed_and_the_others_two_levels():
    eth10, layout = get_profile("eth10"), NodeLayout(2, 2)
    modelled = comm_modelled(counters(), 4, eth10, label_ranks={"group_average": 2}, layout=layout)
    assert modelled["group_average"] == pytest.approx(5 * MEMORY.allreduce(D, 2), rel=1e-12)
    two_levels = MEMORY.allreduce(D, 2) + eth10.allreduce(D, 2)
    assert modelled["average"] == pytest.approx(3 * two_levels, rel=1e-12)
    # an allgather: one in-node message, and one across nodes of the node's two messages
    assert modelled["wire"] == pytest.approx(2 * (MEMORY.p2p(D) + eth10.p2p(2 * D)), rel=1e-12)
    assert modelled["start"] == pytest.approx(MEMORY.alpha * 2, rel=1e-12)
    assert modelled["group_average"] < comm_modelled(counters(), 4, eth10, label_ranks={"group_average": 2})[
        "group_average"] / 10
    # a group of 2 on round-robin nodes spans both nodes with one rank on each: all network
    spanning = {("allreduce", "group_average"): OpCounter(5, 5 * D, 0.1, 0, 0)}
    assert comm_modelled(spanning, 4, eth10, label_ranks={"group_average": 2}, layout=layout) == {
        "group_average": pytest.approx(5 * eth10.allreduce(D, 2), rel=1e-12)}


def test_a_fitted_in_node_profile_prices_the_in_node_calls_and_a_run_on_one_node_as_before():
    spec = "alpha=4e-3,beta=8.5e-8,memory_alpha=1e-4,memory_bandwidth=4e8"
    fitted = get_profile(spec)
    assert fitted.memory is not None
    assert (fitted.memory.alpha, fitted.memory.beta) == (1e-4, pytest.approx(1 / 4e8))
    assert get_profile("alpha=4e-3,beta=8.5e-8").memory is None
    layout = node_layout_of((0, 0, 1, 1), fitted.memory)
    assert layout == NodeLayout(2, 2, fitted.memory)
    modelled = comm_modelled(counters(), 4, fitted, label_ranks={"group_average": 2}, layout=layout)
    # the emulated links' two-level and int8 rounds: their in-node part on the fitted memory
    assert modelled["group_average"] == pytest.approx(5 * fitted.memory.allreduce(D, 2), rel=1e-12)
    assert modelled["average"] == pytest.approx(
        3 * (fitted.memory.allreduce(D, 2) + fitted.allreduce(D, 2)), rel=1e-12)
    attrs = profile_attrs(fitted, layout=layout)
    assert (attrs["network_memory_alpha"], attrs["network_memory_beta"]) == (1e-4, pytest.approx(1 / 4e8))
    assert node_layout_of((0, 0, 1, 1)) == NodeLayout(2, 2, MEMORY)
    # one node: no layout, every call on the network profile as before
    network_only = get_profile(spec.split(",memory")[0])
    assert comm_modelled(counters(), 4, fitted) == comm_modelled(counters(), 4, network_only)
    for bad in ("alpha=1,beta=1,memory_alpha=1", "alpha=1,beta=1,memory_beta=1",
                "alpha=1,beta=1,memory_gamma=1", "alpha=1,beta=1,memory_alpha=1,memory_beta=1,memory_bandwidth=1"):
        with pytest.raises(HpcoptError, match="memory_|takes"):
            get_profile(bad)


def test_a_trace_is_modelled_on_nodes_as_the_run_was():
    eth10, layout = get_profile("eth10"), NodeLayout(2, 2)
    trace = {label: {name: np.array([getattr(c, name)])
                     for name in ("calls", "bytes", "in_node_calls", "in_node_bytes")}
             for (_, label), c in counters().items()}
    ops = {"wire": "allgather", "start": "barrier"}
    modelled = comm_modelled(counters(), 4, eth10, label_ranks={"group_average": 2}, layout=layout)
    rows = trace_modelled(trace, ops, 4, eth10, label_ranks={"group_average": 2}, layout=layout)
    assert rows[0] == pytest.approx(sum(v for k, v in modelled.items() if k != "start"), rel=1e-12)
    for fields in trace.values():  # a trace from before the split: every call across nodes
        del fields["in_node_calls"], fields["in_node_bytes"]
    old = trace_modelled(trace, ops, 4, eth10, label_ranks={"group_average": 2}, layout=layout)
    assert old[0] > rows[0]


def test_a_non_blocking_reduction_is_hidden_only_by_the_fraction_measured_hidden(monkeypatch):
    from hpcopt.comm import IN_FLIGHT, OpCounter
    from hpcopt.comm.core import progress_mode
    from hpcopt.comm.costmodel import HIDDEN

    eth1, between = get_profile("eth1"), 0.005  # seconds of computation between posts and waits
    counters = {("iallreduce", "fragments"): OpCounter(4, 4 * 10**6, 0.3),
                (IN_FLIGHT, "fragments"): OpCounter(0, 0, 0.3 + between)}
    whole = 4 * eth1.allreduce(10**6, 2)  # 32 ms
    assert comm_modelled(counters, 2, eth1, hidden=0.0)["fragments"] == whole  # moved only in the wait
    assert comm_modelled(counters, 2, eth1, hidden=0.2)["fragments"] == pytest.approx(whole - between)
    assert comm_modelled(counters, 2, eth1, hidden=0.001)["fragments"] == pytest.approx(0.999 * whole)
    # the default: all of the time between hides, as before the measurement
    assert comm_modelled(counters, 2, eth1)["fragments"] == pytest.approx(whole - between, rel=1e-12)
    monkeypatch.delenv("MPIR_CVAR_ASYNC_PROGRESS", raising=False)
    assert progress_mode() == "calls" and HIDDEN["calls"] == 0.0
    monkeypatch.setenv("MPIR_CVAR_ASYNC_PROGRESS", "1")
    assert progress_mode() == "thread" and 0 < HIDDEN["thread"] < 1


def test_rails_share_one_link_so_the_network_carries_k_times_a_rails_bytes():
    """K = 2 rails of the compressed round on 2 nodes of 2 ranks (hpcopt/comm/wire_nodes.py):
    a rank's alltoall and allgather of its 1/K share cost on the network what one leader's
    calls of the whole message cost; their in-node calls and every other label are unchanged."""
    eth10, layout = get_profile("eth10"), NodeLayout(2, 2)
    share = {("alltoall", "average"): OpCounter(3, 3 * D, 0.1, 0, 0),
             ("allgather", "average"): OpCounter(3, 3 * D // 2, 0.1, 0, 0),
             ("alltoall", "average_node"): OpCounter(3, 3 * D, 0.1, 3, 3 * D)}
    whole = {("alltoall", "average"): OpCounter(3, 6 * D, 0.1, 0, 0),
             ("allgather", "average"): OpCounter(3, 3 * D, 0.1, 0, 0),
             ("alltoall", "average_node"): OpCounter(3, 3 * D, 0.1, 3, 3 * D)}
    spans = {"average": 2, "average_node": 2}
    rails = comm_modelled(share, 4, eth10, label_ranks=spans, layout=layout, label_rails={"average": 2})
    leader = comm_modelled(whole, 4, eth10, label_ranks=spans, layout=layout)
    assert rails == pytest.approx(leader, rel=1e-12)
    alone = comm_modelled(share, 4, eth10, label_ranks=spans, layout=layout)
    assert alone["average"] < rails["average"]  # one rail alone on the link: less
    assert alone["average_node"] == rails["average_node"]
