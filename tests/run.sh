#!/usr/bin/env bash
# The whole test suite: serial tests, then the MPI tests under mpiexec at 1, 2, 3 and 4 ranks.
# tests/gpu runs in both (each test skipped, with the reason, where CuPy finds no GPU).
# Every MPI run has an outer timeout and a conftest hook that aborts all ranks when one fails,
# so a broken test ends the run instead of hanging it. Exits non-zero on any failure, and when
# pytest collects no test (its exit code 5).
set -euo pipefail
cd "$(dirname "$0")/.."
export MPIEXEC_TIMEOUT="${MPIEXEC_TIMEOUT:-600}"
pytest_args=(-q -p no:cacheprovider)

echo "== serial tests"
python -m pytest "${pytest_args[@]}" tests

for n in ${HPCOPT_TEST_SIZES:-1 2 3 4}; do
    echo "== MPI tests on $n rank(s)"
    # rank 0 reports; the other ranks' stdout is dropped (their failures reach stderr)
    timeout -k 10 660 mpiexec -n "$n" bash -c '
        rank="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}"
        if [ "$rank" = 0 ]; then exec python -m pytest "$@"; fi
        exec python -m pytest "$@" > /dev/null' _ --with-mpi "${pytest_args[@]}" tests/mpi tests/gpu
done
echo "== all test runs passed"
