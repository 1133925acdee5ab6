"""Inner and outer optimizers (hpcopt/algorithms/inner.py, outer.py) on PR-SGD and CELGC under
MPI at any world size: the serial float64 references of tests/reference.py, SlowMo and DiLoCo
as settings of PR-SGD bit for bit, the state written to a checkpoint and read back at every
tick (mid-round included) without changing a bit of the run, and the traffic: the outer step
sends nothing, adamw's moments only under their "average" policies. The bitwise resume of a
whole run is the ``celgc-diloco`` case of tests/mpi/test_resume.py."""

from __future__ import annotations

import numpy as np
import pytest

from hpcopt import train
from hpcopt.algorithms import state as fields
from hpcopt.build import build_run
from hpcopt.config import build_config
from hpcopt.io import data_parallel_checkpoint as ckpt_io
from hpcopt.run import checkpointing
from hpcopt.run.window import Window
from tests.conftest import host, on_devices
from tests.reference import celgc_reference, prsgd_reference, worker_parts
from tests.runs import fresh_train

pytestmark = pytest.mark.mpi

DILOCO = {"outer_optimizer": "nesterov", "outer_lr": 0.7, "outer_momentum": 0.9,
          "inner_optimizer": "adamw", "lr": 0.01}


def small_config(**overrides):
    base = dict(dataset="digits", hidden="12", batch_size="8", steps="14", dtype="float64",
                lr="0.1", interval="4", progress="false", seed="3")
    base.update({k: str(v) for k, v in overrides.items()})
    return build_config(None, {k: v for k, v in base.items() if v != "None"})  # None: drop a key


def heterogeneous(size):
    return ",".join(str(2 + r % 3) for r in range(size))


def outer_state(state):
    """The outer optimizer's arrays (the round's start and its buffer), on the host."""
    return [host(getattr(state, name)) for name in ("anchor", "outer_buffer", "slow_buffer",
                                                     "outer_exp_avg", "outer_exp_avg_sq")
            if getattr(state, name, None) is not None]


def assert_shared(comm, state):
    """The anchor and the outer buffer are the same on every rank."""
    everyone = comm.mpi.allgather(outer_state(state))
    for arrays in everyone:
        for a, b in zip(arrays, everyone[0]):
            np.testing.assert_array_equal(a, b)


PRSGD_CASES = [
    {**DILOCO, "weight_decay": 0.05},
    {"outer_optimizer": "sgd", "outer_lr": 1.2, "outer_momentum": 0.5, "momentum": 0.9,
     "weight_decay": 1e-3, "schedule": "step", "milestones": "6", "decay": 0.5},
    {"outer_optimizer": "slowmo", "outer_lr": 0.9, "outer_momentum": 0.6, "inner_optimizer": "adamw",
     "lr": 0.01, "momentum_policy": "average", "second_moment_policy": "reset"},
    {"inner_optimizer": "adamw", "lr": 0.01, "momentum_policy": "reset", "adam_beta1": 0.8,
     "second_moment_policy": "average", "adam_beta2": 0.95, "adam_eps": 1e-6,
     "outer_optimizer": "sgd", "outer_lr": 0.8},
    {**DILOCO, "local_steps": "heterogeneous", "interval": 3, "steps": 12},
    {"algorithm": "slowmo", "inner_optimizer": "adamw", "lr": 0.01, "weight_decay": 0.1},
    {"algorithm": "diloco", "steps": 9},  # a partial last round: the plain average ends the run
    {"algorithm": "diloco", "schedule": "cosine", "warmup": 5},  # DiLoCo's inner schedule
    # FedAdam and FedYogi (Reddi et al. 2021) over AdamW and momentum SGD
    {"outer_optimizer": "fedadam", "outer_lr": 0.02, "outer_momentum": 0.8, "outer_beta2": 0.95,
     "outer_tau": 1e-2, "inner_optimizer": "adamw", "lr": 0.01},
    {"outer_optimizer": "fedyogi", "outer_lr": 0.03, "outer_momentum": 0.9, "outer_beta2": 0.9,
     "outer_tau": 3e-3, "momentum": 0.9},
    # Muon inside (MuLoCo: with DiLoCo's outer step), and with heavy ball and its buffer averaged
    {"inner_optimizer": "muon", "lr": 0.02, "momentum": 0.95, "nesterov": "true",
     "weight_decay": 0.01, "outer_optimizer": "nesterov", "outer_lr": 0.7, "outer_momentum": 0.9},
    {"inner_optimizer": "muon", "lr": 0.02, "momentum": 0.9, "momentum_policy": "average"},
]


# on the GPU: adamw with its moments' policies, the outer steps with a buffer (and in CELGC's
# case below, adamw with the clipped step size as a 0-d device array)
@pytest.mark.parametrize("overrides, device", on_devices(PRSGD_CASES, PRSGD_CASES[1:3]),
                         indirect=["device"])
def test_prsgd_with_inner_and_outer_optimizers_matches_the_serial_reference(comm, overrides, device):
    if overrides.get("local_steps") == "heterogeneous":
        overrides = {**overrides, "local_steps": heterogeneous(comm.size)}
    config = small_config(device=device, **overrides)
    _, state = train(config, comm, verbose=False)
    np.testing.assert_allclose(host(state.x), prsgd_reference(config, comm.size), rtol=1e-10,
                               atol=1e-12)
    assert_shared(comm, state)


CELGC_CASES = [
    # I divides T: the final average closes a complete round and takes its outer step
    {**DILOCO, "steps": 12, "weight_decay": 0.05},
    {**DILOCO, "participation": 0.5, "clip_norm": "global", "momentum_policy": "average",
     "second_moment_policy": "reset", "interval": 3},
    {"outer_optimizer": "slowmo", "outer_lr": 0.9, "outer_momentum": 0.5, "momentum": 0.9,
     "schedule": "step", "milestones": "6", "decay": 0.5, "steps": 12},
]


@pytest.mark.parametrize("overrides, device", on_devices(CELGC_CASES, CELGC_CASES[:1]),
                         indirect=["device"])
def test_celgc_with_inner_and_outer_optimizers_matches_the_serial_reference(comm, overrides, device):
    """CELGC with DiLoCo's optimizers (clipped AdamW steps inside a round, the Nesterov outer
    step on top) through train()."""
    # clipped when ||g|| > gamma / lr = 1.5: on some steps, not on others
    config = small_config(algorithm="celgc", device=device,
                          gamma=1.5 * float(overrides.get("lr", 0.1)), **overrides)
    summary, state = train(config, comm, verbose=False)
    algo, steps = config.algorithm, config.run.steps
    parts = worker_parts(config, comm.size)
    inner = {key: getattr(algo, key) for key in (
        "momentum", "nesterov", "weight_decay", "momentum_policy", "inner_optimizer", "adam_beta1",
        "adam_beta2", "adam_eps", "second_moment_policy")}
    models, counts = celgc_reference(
        parts[0].workload.x0, [p.workload.problem.oracle for p in parts], steps, algo.interval,
        lr=parts[0].algorithm.lr_at, gamma=algo.gamma, base_lr=algo.lr,
        participation=algo.participation, seed=config.run.seed, clip_norm=algo.clip_norm,
        outer_optimizer=algo.outer_optimizer, outer_lr=algo.outer_lr,
        outer_momentum=algo.outer_momentum, finish=True, **inner)
    np.testing.assert_allclose(host(state.x), models[comm.rank], rtol=1e-10, atol=1e-12)
    assert int(state.clip_count) == counts[comm.rank]
    assert summary.clip_fraction > 0  # the clipped step size reaches adamw
    assert_shared(comm, state)


@pytest.mark.parametrize("preset, options", [
    ({"algorithm": "slowmo", "slow_momentum": 0.6, "slow_lr": 0.9, "momentum": 0.9},
     {"outer_optimizer": "slowmo", "outer_lr": 0.9, "outer_momentum": 0.6, "momentum": 0.9}),
    ({"algorithm": "diloco", "lr": None},  # its own lr
     {"outer_optimizer": "nesterov", "outer_lr": 0.7, "outer_momentum": 0.9,
      "inner_optimizer": "adamw", "lr": 0.001, "weight_decay": 0.01}),
])
def test_slowmo_and_diloco_are_settings_of_prsgd_bit_for_bit(comm, preset, options):
    common = {"momentum_policy": "average", "schedule": "step", "milestones": "5", "decay": 0.5}
    _, named = fresh_train(small_config(**preset, **common))
    _, prsgd = fresh_train(small_config(**options, **common))
    np.testing.assert_array_equal(named.x, prsgd.x)
    for a, b in zip(outer_state(named), outer_state(prsgd)):
        np.testing.assert_array_equal(a, b)


def state_arrays(state) -> dict[str, np.ndarray]:
    """Every field a checkpoint holds, on the host."""
    arrays = {name: host(getattr(state, name))
              for name in fields.present(state, fields.MODEL, fields.VECTOR, fields.SHARED)}
    for kind in (fields.COUNTER, fields.SCALAR, fields.FLAG):
        arrays.update({name: np.asarray(v) for name, v in fields.numbers(state, kind).items()})
    return arrays


def run_in_process(config, comm, directory=None):
    """The run in-process; with a ``directory``, at every tick of the algorithm's clock its
    state (and sampler) is written to a checkpoint there, read back into a fresh state, and the
    run goes on from that one. Returns the final state (after the end-of-run average) and the
    ticks passed."""
    parts = build_run(config, comm)
    algorithm, workload = parts.algorithm, parts.workload
    sampler = workload.problem.sampler
    state = algorithm.init(workload.x0, comm)
    ticks = []
    for _ in range(parts.local_steps):
        algorithm.step(state, workload.problem.oracle, comm)
        tick = algorithm.clock(state)
        if tick is None or directory is None:
            continue
        synchronized = algorithm.synchronized(state)
        model = state.x if synchronized else comm.average_(state.x.copy(), label="checkpoint")
        path = directory / f"step-{tick}.h5"
        at = checkpointing.Position(config, workload.layout, tick, "every-tick", 0, 0.0)
        checkpointing.save(path, comm, at, state, synchronized=synchronized, model=model,
                     sampler=sampler, window=Window(parts.backend, clipping=algorithm.clips).fold())
        comm.mpi.Barrier()
        fresh = algorithm.init(workload.x0.copy(), comm)
        ckpt = ckpt_io.read_checkpoint(path, comm.rank, comm.size, verify=False)
        checkpointing.restore(ckpt, comm.rank, fresh, sampler, parts.backend)
        state = fresh
        ticks.append(tick)
    if not algorithm.synchronized(state):
        algorithm.finish(state, comm, label="final")
    return state, ticks


@pytest.mark.parametrize("overrides", [
    # I = 2: ticks mid-round, at a round's end, and mid-round after outer steps
    {**DILOCO, "momentum_policy": "average", "second_moment_policy": "reset", "interval": 2,
     "steps": 5},
    {**DILOCO, "algorithm": "celgc", "gamma": 0.015, "participation": 0.5, "interval": 2,
     "steps": 5},
    {"algorithm": "slowmo", "inner_optimizer": "adamw", "lr": 0.01, "slow_momentum": 0.7,
     "interval": 2, "steps": 4},
    {"outer_optimizer": "fedyogi", "outer_lr": 0.03, "interval": 2, "steps": 5},
    # per-rank local steps: the clock ticks at rounds
    {"outer_optimizer": "sgd", "outer_momentum": 0.5, "momentum": 0.9, "local_steps": "heterogeneous",
     "interval": 2, "steps": 6},
])
def test_a_checkpoint_at_every_tick_changes_no_bit(comm, shared_dir, overrides):
    if overrides.get("local_steps") == "heterogeneous":
        overrides = {**overrides, "local_steps": heterogeneous(comm.size)}
    config = small_config(**overrides)
    state, ticks = run_in_process(config, comm, shared_dir)
    plain, _ = run_in_process(config, comm)
    interval = config.algorithm.interval
    assert ticks == (list(range(1, config.run.steps // interval + 1)) if config.algorithm.local_steps
                     else list(range(1, config.run.steps + 1)))
    expected, got = state_arrays(plain), state_arrays(state)
    assert sorted(got) == sorted(expected)
    assert {"anchor", "exp_avg", "exp_avg_sq", "outer_buffer", "slow_buffer", "outer_exp_avg"} & set(got)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_the_outer_step_sends_nothing_and_adams_moments_follow_their_policies(comm):
    """The same run with and without the outer step has the same traffic, label by label; adamw's
    m and v cost one allreduce of d values each per round under "average" (labels "momentum"
    and "second_moment"), nothing otherwise."""
    steps, interval = 14, 4
    options = {"inner_optimizer": "adamw", "lr": 0.01, "steps": steps, "interval": interval,
               "dtype": "float32", "momentum_policy": "average", "second_moment_policy": "average"}
    runs = {}
    for outer in ({}, {"outer_optimizer": "nesterov", "outer_momentum": 0.9, "outer_lr": 0.7}):
        for algorithm in ("prsgd", "celgc"):
            summary, state = train(small_config(algorithm=algorithm, **options, **outer), comm,
                                   verbose=False)
            runs[algorithm, bool(outer)] = {row[1]: row[2:4] for row in comm.stats.as_rows()
                                            if row[1] not in ("summary", "trace")}
            comm.stats.reset()
    d = state.x.size
    for algorithm, rounds in (("prsgd", steps // interval), ("celgc", -(-steps // interval))):
        assert runs[algorithm, True] == runs[algorithm, False]
        for label in ("average", "momentum", "second_moment"):
            assert runs[algorithm, True][label] == (rounds, rounds * d * 4), (algorithm, label)
    single = small_config(**{**options, "second_moment_policy": "keep", "momentum_policy": "reset"})
    train(single, comm, verbose=False)
    labels = {row[1] for row in comm.stats.as_rows()}
    assert "average" in labels and not labels & {"momentum", "second_moment"}
