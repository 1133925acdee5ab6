#!/usr/bin/env bash
# The whole test suite: serial tests, then the MPI tests under mpiexec at 1, 2, 3 and 4 ranks,
# then every GPU case (marker gpu: tests/gpu and the cupy/gpu cases of the ``xp`` and ``device``
# fixtures) again on the emulated CuPy of tests/emulated_gpu (host memory posing as a device: it
# checks that no host array meets a device array and that MPI gets device buffers, not that a
# GPU works). In the first passes the GPU cases are skipped with the reason where CuPy finds no
# GPU, and run on the real CuPy where it does.
# Every MPI run has an outer timeout and a conftest hook that aborts all ranks when one fails,
# so a broken test ends the run instead of hanging it. Exits non-zero on any failure, and when
# pytest collects no test (its exit code 5).
set -euo pipefail
cd "$(dirname "$0")/.."
export MPIEXEC_TIMEOUT="${MPIEXEC_TIMEOUT:-600}"
pytest_args=(-q -p no:cacheprovider)
sizes="${HPCOPT_TEST_SIZES:-1 2 3 4}"

# mpi_pytest N ARGS...: pytest under mpiexec -n N; rank 0 reports, the other ranks' stdout is
# dropped (their failures reach stderr)
mpi_pytest() {
    local n="$1"
    shift
    timeout -k 10 660 mpiexec -n "$n" bash -c '
        rank="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}"
        if [ "$rank" = 0 ]; then exec python -m pytest "$@"; fi
        exec python -m pytest "$@" > /dev/null' _ --with-mpi "${pytest_args[@]}" "$@"
}

echo "== serial tests"
python -m pytest "${pytest_args[@]}" tests

for n in $sizes; do
    echo "== MPI tests on $n rank(s)"
    mpi_pytest "$n" tests/mpi tests/gpu
done

echo "== GPU tests on the emulated CuPy (no GPU involved)"
(
    # two emulated devices per node, and device buffers handed straight to MPI where a test
    # does not ask for staging (host memory, so any MPI can read it)
    export PYTHONPATH="$PWD/tests/emulated_gpu${PYTHONPATH:+:$PYTHONPATH}" EMULATED_GPU_COUNT=2 \
        HPCOPT_GPU_AWARE_MPI=1
    python -m pytest "${pytest_args[@]}" -m gpu tests
    for n in $sizes; do
        echo "== emulated GPU tests on $n rank(s)"
        mpi_pytest "$n" -m gpu tests/mpi tests/gpu
    done
)
echo "== all test runs passed"
