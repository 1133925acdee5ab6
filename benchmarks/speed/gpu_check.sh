#!/usr/bin/env bash
# The GPU check: one command for a machine with a GPU and no internet access where CuPy, mpi4py
# and h5py are already installed (pytest and pytest-mpi too, ideally). From the repository:
#
#     bash benchmarks/speed/gpu_check.sh DIR
#
# It installs hpcopt from this working tree without downloading anything, reports the
# environment (GPU, versions, `hpcopt info` with the CUDA-aware self-test), runs every
# gpu-marked test case (the cupy/gpu cases of tests/unit, tests/mpi and tests/gpu, plus the
# device-buffer Comm tests) at 1 rank, the GPU benchmark (benchmarks/speed/gpu.py: MLP training-step
# throughput GPU vs CPU, averaging bandwidth on device buffers), a short training run on the
# GPU, and the MPI cases again at 2 ranks. Every stage writes DIR/<stage>.log and a line of
# DIR/status.tsv (stage, exit status, seconds); a failing stage does not stop the others.
# DIR/summary.md collects the statuses, test outcomes and benchmark tables. The whole check
# stops starting stages after CHECK_SECONDS (default 285) and caps each stage, so it ends
# within 5 minutes. Without a GPU, `PYTHONPATH=tests/emulated_gpu` rehearses it on the
# emulated CuPy (its tables then name the "GPU" EMULATED and mean nothing).
# Exit status: 0 when every stage passed, 1 otherwise.
#
# Variables: PYTHON (default python3), MPIEXEC (default mpiexec), CHECK_SECONDS.
set -u -o pipefail

if [ $# -ne 1 ]; then
    echo "usage: bash benchmarks/speed/gpu_check.sh DIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
out="$(cd "$1" && pwd)"
cd "$(dirname "$0")/../.." || exit 2
repo="$(pwd)"
PYTHON="${PYTHON:-python3}"
MPIEXEC="${MPIEXEC:-mpiexec}"
budget="${CHECK_SECONDS:-285}"
started="$(date +%s)"
status="$out/status.tsv"
printf 'stage\texit\tseconds\n' > "$status"
failures=0
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"  # works even if the install stage fails
export MPIEXEC_TIMEOUT=150 PYTHON MPIEXEC repo
counted=1  # 0 while running an informational stage, whose failure is not a failed check

# stage NAME CAP_SECONDS COMMAND...: run COMMAND (a program or a function of this script) with
# its output in DIR/NAME.log, at most CAP_SECONDS and never past the overall budget; record its
# exit status (124: timed out).
stage() {
    local name="$1" cap="$2" left rc begin
    shift 2
    left=$(( budget - ($(date +%s) - started) ))
    if [ "$left" -lt 10 ]; then
        printf '%s\tskipped (out of time)\t0\n' "$name" >> "$status"
        echo "== $name: skipped, out of time"
        failures=$((failures + counted))
        return
    fi
    [ "$cap" -gt "$left" ] && cap="$left"
    echo "== $name (at most ${cap}s)"
    begin="$(date +%s)"
    timeout -k 5 "$cap" bash -c '"$@"' _ "$@" > "$out/$name.log" 2>&1
    rc=$?
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - begin ))" >> "$status"
    echo "   exit $rc ($(( $(date +%s) - begin ))s), log: $out/$name.log"
    [ "$rc" -ne 0 ] && failures=$((failures + counted))
    return 0
}

# Runs pytest under mpiexec; only rank 0's report goes to the log (other ranks' failures still
# reach stderr, and the tests' conftest aborts all ranks when one fails).
mpi_pytest() {
    local ranks="$1"
    shift
    "$MPIEXEC" -n "$ranks" bash -c '
        rank="${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-0}}}"
        if [ "$rank" = 0 ]; then exec "$0" -m pytest "$@"; fi
        exec "$0" -m pytest "$@" > /dev/null' "$PYTHON" "$@"
}

environment() {
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
    "$PYTHON" - <<'EOF'
import importlib, platform
print("python", platform.python_version())
for name in ("numpy", "mpi4py", "h5py", "cupy", "pytest", "pytest_mpi", "setuptools"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as exc:
        print(name, "MISSING:", exc)
import cupy
print("CUDA devices", cupy.cuda.runtime.getDeviceCount(), "runtime", cupy.cuda.runtime.runtimeGetVersion())
EOF
}

install() {  # from this tree, no index, no build isolation: nothing is downloaded
    "$PYTHON" -m pip install --no-deps --no-build-isolation --no-index -e "$repo" \
        || { echo "pip install failed: the other stages import hpcopt through PYTHONPATH"; return 1; }
}

# Without pytest-mpi, a one-option plugin lets `--with-mpi` through (tests marked mpi then run,
# which is what they should do under mpiexec).
plugin_args=()
if ! "$PYTHON" -c "import pytest_mpi" 2> /dev/null; then
    mkdir -p "$out/plugin"
    printf 'def pytest_addoption(parser):\n    parser.addoption("--with-mpi", action="store_true")\n' \
        > "$out/plugin/hpcopt_with_mpi.py"
    export PYTHONPATH="$out/plugin:$PYTHONPATH"
    plugin_args=(-p hpcopt_with_mpi)
fi
pytest_args=(-q -rs -p no:cacheprovider ${plugin_args[@]+"${plugin_args[@]}"} --with-mpi)

# gpu_tests N DIRS...: every gpu-marked case (the cupy/gpu cases of the whole suite and
# tests/gpu) in DIRS at N ranks, then the CPU tests of the device-buffer paths of Comm
gpu_tests() {
    local ranks="$1" rc=0
    shift
    # shellcheck disable=SC2086  # pytest_words splits into the options on purpose
    mpi_pytest "$ranks" $pytest_words -m gpu "$@" || rc=1
    # shellcheck disable=SC2086
    mpi_pytest "$ranks" $pytest_words tests/unit/test_staging.py tests/mpi/test_device_comm.py || rc=1
    return "$rc"
}
export -f environment install mpi_pytest gpu_tests
export pytest_words="${pytest_args[*]}"  # arrays do not reach the stages' shells; no spaces inside

stage environment 30 environment
stage install 60 install
stage info 40 env HPCOPT_GPU_SELFTEST=1 "$MPIEXEC" -n 2 "$PYTHON" -m hpcopt info
# informational: exit 0 = device buffers reach this MPI safely; a signal (e.g. 139) = not CUDA-aware
counted=0
stage selftest 40 "$PYTHON" -m hpcopt.comm.gpu_selftest --memory cuda
counted=1
stage tests-1-rank 150 gpu_tests 1 tests/unit tests/mpi tests/gpu
stage bench-throughput 40 "$PYTHON" benchmarks/speed/gpu.py --part throughput --out "$out"
stage bench-averaging 40 "$MPIEXEC" -n 2 "$PYTHON" benchmarks/speed/gpu.py --part averaging --out "$out"
"$PYTHON" tests/gpu/tiny_images.py "$out/images" > /dev/null 2>&1
stage train-gpu 30 "$MPIEXEC" -n 2 "$PYTHON" -m hpcopt train --device gpu --dataset mnist_idx \
    --path "$out/images" --hidden 64 --batch-size 16 --steps 300 --interval 8 --eval-every 100 \
    --out "$out/train-run"
stage tests-2-ranks 90 gpu_tests 2 tests/mpi tests/gpu  # last: the benchmarks come first

{
    echo "# GPU check ($(date -u '+%Y-%m-%d %H:%M UTC'), $(( $(date +%s) - started ))s)"
    echo
    echo '| stage | exit | seconds |'
    echo '|---|---|---|'
    tail -n +2 "$status" | while IFS=$'\t' read -r name rc seconds; do
        echo "| $name | $rc | $seconds |"
    done
    for name in tests-1-rank tests-2-ranks; do
        [ -f "$out/$name.log" ] || continue
        echo
        echo "## $name"
        echo '```'
        grep -E '^(FAILED|ERROR|SKIPPED)|passed|failed|error' "$out/$name.log" | tail -n 25
        echo '```'
    done
    for name in environment info selftest train-gpu; do
        [ -f "$out/$name.log" ] || continue
        echo
        echo "## $name"
        echo '```'
        tail -n 25 "$out/$name.log"
        echo '```'
    done
    for part in throughput averaging; do
        [ -f "$out/gpu-$part.md" ] && { echo; cat "$out/gpu-$part.md"; }
    done
} > "$out/summary.md"
echo "== summary: $out/summary.md ($failures stage(s) failed or skipped; selftest not counted)"
[ "$failures" -eq 0 ]
