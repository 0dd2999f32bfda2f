#!/usr/bin/env bash
# The two GPU commands, from the repository root of a copy on the GPU machine, on its own PyTorch.
#
#   bash benchmarks/gpu/commands.sh first OUT [--data DIR] [--kit KIT] [--budget SECONDS]
#       benchmarks/gpu/figures.py: data, airbench94 beside, accuracy, time to its accuracy, speed;
#       meanwhile Horovod builds against this PyTorch (scripts/setup.sh), at the lowest priority
#       on a quarter of the cores, and its wheel, stripped of debug information, is left in OUT
#   bash benchmarks/gpu/commands.sh second OUT [--kit KIT] [--budget SECONDS] [check.py flags]
#       Horovod's wheel from OUT (or a build), then benchmarks/gpu/check.py's jobs (the ports
#       beside main.py, Horovod's levers, resumes, CUDA paths), merged into OUT/results-gpu.json
#
# --data DIR   real CIFAR-10 (default ./data, where `python main.py --download` puts it)
# --kit KIT    a folder for a machine without package registries: horovod-0.28.1.tar.gz, the
#              wheels Horovod's build lacks (cffi, pycparser) and airbench-0.1.8.tar.gz; without
#              it, pip fetches them
# --budget S   seconds the command may take (default: 900 for the first, 600 for the second)
set -uo pipefail
cd "$(dirname "$0")/../.."
usage() { echo "usage: bash benchmarks/gpu/commands.sh first|second OUT [--data DIR] [--kit KIT] [--budget S]" >&2; exit 2; }
[ $# -ge 2 ] || usage
what=$1 out=$2
shift 2
data=data kit="" budget=""
extra=()
while [ $# -gt 0 ]; do
    case $1 in
        --data) data=$2; shift 2 ;;
        --kit) kit=$(readlink -f "$2"); shift 2 ;;
        --budget) budget=$2; shift 2 ;;
        *) extra+=("$1"); shift ;;
    esac
done
case $what in first) budget=${budget:-900} ;; second) budget=${budget:-600} ;; *) usage ;; esac
export PYTHONUNBUFFERED=1 TORCH=system PYTHON=python3 CIFAR_HVD_CACHE=${CIFAR_HVD_CACHE:-$HOME/.cache/cifar-horovod}
airbench=()
if [ -n "$kit" ]; then
    export HOROVOD_SDIST=$kit/horovod-0.28.1.tar.gz WHEELS=$kit
    [ -f "$kit/airbench-0.1.8.tar.gz" ] && airbench=(--airbench "$kit/airbench-0.1.8.tar.gz")
fi
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
cores=$(nproc)
started=$SECONDS

export_wheel() {
    local whl work
    whl=$(ls "$CIFAR_HVD_CACHE"/*/horovod-*.whl 2>/dev/null | head -1)
    [ -n "$whl" ] || { echo "no wheel built"; return 1; }
    basename "$(dirname "$whl")" > "$out/horovod-wheel-dir.txt"
    work=$(mktemp -d)
    python3 -m wheel unpack "$whl" -d "$work" >/dev/null &&
        find "$work" -name '*.so' -exec strip --strip-debug {} + &&
        python3 -m wheel pack "$work"/horovod-* -d "$out" >/dev/null
    ls -l "$out"/horovod-*.whl
}

case $what in
first)
    pin() { if command -v taskset >/dev/null; then taskset -c "$@"; else shift; "$@"; fi; }
    quarter=$((cores / 4 > 0 ? cores / 4 : 1))
    (pin "$((cores - quarter))-$((cores - 1))" nice -n 19 bash scripts/setup.sh > "$out/horovod-build.log" 2>&1
     echo "setup exit $?" >> "$out/horovod-build.log") &
    build=$!
    # the measurements' budget leaves a tenth for the build to end and its wheel to be packed
    pin "0-$((cores - quarter - 1))" python3 -m benchmarks.gpu.figures --data "$data" "${airbench[@]}" \
        --out "$out/results-gpu.json" --budget "$((budget * 9 / 10 - 20))" "${extra[@]}" 2>&1 | tee "$out/first.log"
    while kill -0 "$build" 2>/dev/null && [ $((SECONDS - started)) -lt "$((budget - 15))" ]; do sleep 2; done
    tail -3 "$out/horovod-build.log"
    export_wheel
    ;;
second)
    if ls "$out"/horovod-*.whl >/dev/null 2>&1 && [ -f "$out/horovod-wheel-dir.txt" ]; then
        # the first command's wheel, where setup.sh looks for a cached one
        mkdir -p "$CIFAR_HVD_CACHE/$(cat "$out/horovod-wheel-dir.txt")"
        cp "$out"/horovod-*.whl "$CIFAR_HVD_CACHE/$(cat "$out/horovod-wheel-dir.txt")/"
    fi
    bash scripts/setup.sh > "$out/setup.log" 2>&1 || { tail -20 "$out/setup.log"; exit 1; }
    tail -2 "$out/setup.log"
    [ -f "$out/results-gpu.json" ] || cp benchmarks/results/results-gpu.json "$out/results-gpu.json"
    timeout "$((budget - (SECONDS - started) - 10))" .venv/bin/python -m benchmarks.gpu.check --no-setup \
        --images 50000 --merge "$out/results-gpu.json" --out "$out/gpu-check.json" "${extra[@]}" 2>&1 \
        | tee "$out/second.log"
    ;;
esac
