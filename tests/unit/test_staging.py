"""The GPU path without a GPU: device choice, the CUDA-aware decision, its override and self-test."""

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from hpcopt.backend import CPU, Backend, get_backend, gpu_for_local_rank
from hpcopt.comm import staging
from hpcopt.comm.mpi_support import singleton_environment
from hpcopt.comm.staging import (
    HOST_PATH,
    PathChoice,
    choose_path,
    env_flag,
    gpu_report,
    run_selftest,
    transport_for,
)
from hpcopt.config import build_config, check_resume
from hpcopt.errors import HpcoptError
from tests.fake_device import FakeDeviceBackend

AWARE, SELFTEST = "HPCOPT_GPU_AWARE_MPI", "HPCOPT_GPU_SELFTEST"


@pytest.mark.parametrize("text,value", [("", None), ("  ", None), ("0", False), ("1", True),
                                        (" 1\n", True)])
def test_env_flag_reads_0_1_or_unset(text, value):
    assert env_flag(AWARE, {AWARE: text}) is value
    assert env_flag(AWARE, {}) is None


@pytest.mark.parametrize("text", ["yes", "true", "2", "-1", "on"])
def test_env_flag_rejects_anything_else_in_one_line(text):
    with pytest.raises(HpcoptError, match=f"{AWARE} must be 0 or 1, got '{text}'"):
        env_flag(AWARE, {AWARE: text})


@pytest.mark.parametrize("query,override,staged,why", [
    (True, None, False, "query"),
    (False, None, True, "query"),
    (None, None, True, f"query; set {AWARE}=1 if it is CUDA-aware"),
    (False, True, False, f"{AWARE}=1"),   # the user knows better than the library
    (None, True, False, f"{AWARE}=1"),
    (True, False, True, f"{AWARE}=0"),
])
def test_choose_path(query, override, staged, why):
    assert choose_path(query, "query", override) == PathChoice(staged, why)


def test_cpu_backend_never_stages_and_reads_no_variable():
    assert transport_for(CPU, {AWARE: "nonsense"}).choice == HOST_PATH


@pytest.mark.parametrize("answer,staged", [(True, False), (False, True), (None, True)])
def test_transport_follows_the_library_query_without_override(monkeypatch, answer, staged):
    monkeypatch.setattr(staging, "cuda_aware_mpi", lambda: (answer, "the query said so"))
    transport = transport_for(FakeDeviceBackend(), {})
    assert transport.staged is staged
    assert transport.choice.why.startswith("the query said so")


def never(device):
    raise AssertionError("the self-test ran")


def test_override_wins_and_skips_the_query(monkeypatch):
    monkeypatch.setattr(staging, "cuda_aware_mpi", never)
    assert transport_for(FakeDeviceBackend(), {AWARE: "0", SELFTEST: "1"}, selftest=never).staged
    assert not transport_for(FakeDeviceBackend(), {AWARE: "1"}, selftest=never).staged


def test_selftest_checks_a_straight_choice_and_passes():
    calls = []
    transport = transport_for(FakeDeviceBackend(device=3), {AWARE: "1", SELFTEST: "1"},
                              selftest=lambda device: calls.append(device))
    assert calls == [3] and not transport.staged
    assert transport.choice.why == f"{AWARE}=1; self-test passed"


def test_selftest_turns_a_wrong_override_into_a_clear_error():
    with pytest.raises(HpcoptError) as error:
        transport_for(FakeDeviceBackend(), {AWARE: "1", SELFTEST: "1"},
                      selftest=lambda device: "crashed the test process (SIGSEGV)")
    message = str(error.value)
    assert "\n" not in message
    assert f"{AWARE}=1 says MPI can read GPU memory" in message
    assert "SIGSEGV" in message and f"set {AWARE}=0" in message


def test_selftest_child_passes_on_readable_memory():
    assert run_selftest(0, memory="host", timeout=60) is None


def test_selftest_child_reports_a_crash_instead_of_dying():
    """A pointer MPI cannot read crashes the child (as a device pointer crashes an MPI that is
    not CUDA-aware); the parent gets one line naming the signal."""
    failure = run_selftest(0, memory="invalid", timeout=60)
    assert failure == "crashed the test process (SIGSEGV)"


def test_wrong_override_is_caught_end_to_end_with_the_real_child():
    with pytest.raises(HpcoptError, match="SIGSEGV"):
        transport_for(FakeDeviceBackend(), {AWARE: "1", SELFTEST: "1"},
                      selftest=lambda device: run_selftest(device, memory="invalid", timeout=60))


def test_selftest_timeout_is_reported():
    assert run_selftest(0, memory="host", timeout=0.001) == "did not finish within 0.001 s"


def test_singleton_environment_drops_the_launcher_but_keeps_mpi_settings():
    env = {"PMI_FD": "5", "PMI_RANK": "1", "PMIX_NAMESPACE": "x", "HYDRA_CONTROL_FD": "3",
           "OMPI_COMM_WORLD_RANK": "1", "MPI_LOCALRANKID": "1", "OMPI_MCA_pml": "ucx",
           "MPIR_CVAR_ENABLE_GPU": "1", "UCX_TLS": "cuda", "PATH": "/bin",
           "CUDA_VISIBLE_DEVICES": "2", "PRTE_LAUNCHED": "1", "OMPI_WORLD_SIZE": "2",
           "OMPI_MCA_num_procs": "2", "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
           "PMIX_MCA_gds": "hash"}
    assert singleton_environment(env) == {"OMPI_MCA_pml": "ucx", "MPIR_CVAR_ENABLE_GPU": "1",
                                          "UCX_TLS": "cuda", "PATH": "/bin",
                                          "CUDA_VISIBLE_DEVICES": "2",
                                          "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
                                          "PMIX_MCA_gds": "hash"}


@pytest.mark.parametrize("local_rank,count,device", [(0, 4, 0), (3, 4, 3), (5, 4, 1), (2, 1, 0)])
def test_gpu_is_chosen_by_node_local_rank(local_rank, count, device):
    assert gpu_for_local_rank(local_rank, count) == device


class StubDevice:
    current = 0
    used = []

    def __init__(self, index=None):
        self.id = StubDevice.current if index is None else index

    def use(self):
        StubDevice.used.append(self.id)
        StubDevice.current = self.id


def stub_cupy(count, available=True):
    runtime = SimpleNamespace(getDeviceCount=lambda: count)
    return SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: available, runtime=runtime,
                                                Device=StubDevice))


def test_get_backend_selects_the_device_of_the_local_rank(monkeypatch):
    StubDevice.current, StubDevice.used = 0, []
    monkeypatch.setitem(sys.modules, "cupy", stub_cupy(count=4))
    backend = get_backend("gpu", local_rank=6)
    assert StubDevice.used == [2] and backend.device == 2 and backend.is_gpu
    assert get_backend("gpu") == backend  # None keeps the current device


def test_get_backend_without_cupy_or_gpu_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(HpcoptError, match="needs CuPy"):
        get_backend("gpu", 0)
    monkeypatch.setitem(sys.modules, "cupy", stub_cupy(count=0, available=False))
    with pytest.raises(HpcoptError, match="finds no CUDA device"):
        get_backend("gpu", 0)
    with pytest.raises(HpcoptError, match="unknown device 'tpu'"):
        get_backend("tpu")


def test_device_option_is_checked_and_may_change_on_resume():
    with pytest.raises(HpcoptError, match="device must be one of cpu, gpu, got 'tpu'"):
        build_config(None, {"device": "tpu"})
    check_resume(build_config(None, {"device": "gpu"}), build_config(None, {"device": "cpu"}))
    with pytest.raises(HpcoptError, match="cannot change lr"):
        check_resume(build_config(None, {"device": "gpu"}), build_config(None, {"lr": "0.5"}))


def test_cpu_backend_copies_and_host_buffers():
    host = CPU.empty_pinned(6, np.float32)
    assert host.shape == (6,) and host.dtype == np.float32
    source = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert CPU.copy_to_host_(source, host) is host
    np.testing.assert_array_equal(host, np.arange(6))
    target = np.zeros((2, 3), dtype=np.float32)
    CPU.copy_from_host_(target, host * 2)
    np.testing.assert_array_equal(target, source * 2)
    assert Backend("cpu", np) == CPU


def test_info_report_without_cupy(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    gpu, transfers = gpu_report(0, {AWARE: "1", SELFTEST: "1"}, selftest=never)
    assert gpu.startswith("none: device 'gpu' needs CuPy")
    assert transfers == f"passed straight to MPI: {AWARE}=1"


def test_info_report_with_a_gpu_runs_the_selftest(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", stub_cupy(count=2))
    gpu, transfers = gpu_report(3, {AWARE: "1", SELFTEST: "1"},
                                selftest=lambda device: "crashed the test process (SIGSEGV)")
    assert gpu == "device 1 of 2 (node-local rank 3)"
    assert "SELF-TEST FAILED" in transfers and f"set {AWARE}=0" in transfers


def test_train_on_gpu_without_cupy_stops_before_building_anything(monkeypatch):
    from hpcopt import train

    monkeypatch.setitem(sys.modules, "cupy", None)
    config = build_config(None, {"device": "gpu", "steps": "2", "progress": "false"})
    with pytest.raises(HpcoptError, match="needs CuPy") as error:
        train(config, verbose=False)
    assert error.value.everywhere  # agreed by all ranks: each exits 2, rank 0 prints one line
