#!/usr/bin/env bash
# The two GPU commands, as run on an offline GPU machine from a copy of the repository with
# KIT (default .gpu-kit) holding ../shared/gpu-kit's files and, for the first, data/ (the pack).
#
#   bash benchmarks/gpu/commands.sh first OUT    # benchmarks/gpu/figures.py: data, anchors, accuracy, speed
#   bash benchmarks/gpu/commands.sh second OUT   # Horovod with NCCL, then benchmarks/gpu/check.py
#
# While the first measures on 12 of the machine's 16 cores, Horovod builds on the other 4 at the
# lowest priority (scripts/setup.sh against the machine's PyTorch), and its wheel, stripped of
# debug information, is left in OUT: the second command installs it instead of building, on
# this machine or a fresh one given KIT/cache/<the folder named in OUT/horovod-wheel-dir.txt>.
set -uo pipefail
cd "$(dirname "$0")/../.."
what=$1 out=$2 kit=${KIT:-.gpu-kit}
export PYTHONUNBUFFERED=1 CIFAR_HVD_CACHE=$PWD/$kit/cache TORCH=system PYTHON=python3
export HOROVOD_SDIST=$PWD/$kit/horovod-0.28.1.tar.gz WHEELS=$PWD/$kit
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"

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
    (pin 12-15 nice -n 19 bash scripts/setup.sh > "$out/horovod-build.log" 2>&1
     echo "setup exit $?" >> "$out/horovod-build.log") &
    build=$!
    pin 0-11 python3 -m benchmarks.gpu.figures --kit "$kit" --out "$out/results-gpu.json" \
        --budget "${BUDGET:-470}" 2>&1 | tee "$out/first.log"
    while kill -0 "$build" 2>/dev/null && [ "$SECONDS" -lt "${WAIT_UNTIL:-565}" ]; do sleep 2; done
    tail -3 "$out/horovod-build.log"
    export_wheel
    ;;
second)
    bash scripts/setup.sh > "$out/setup.log" 2>&1 || { tail -20 "$out/setup.log"; exit 1; }
    tail -2 "$out/setup.log"
    [ -f "$out/results-gpu.json" ] || cp benchmarks/results/results-gpu.json "$out/results-gpu.json"
    .venv/bin/python -m benchmarks.gpu.check --no-setup --images 50000 --merge "$out/results-gpu.json" \
        --out "$out/gpu-check.json" "${@:3}" 2>&1 | tee "$out/second.log"
    ;;
*) echo "usage: bash benchmarks/gpu/commands.sh first|second OUT" >&2; exit 2 ;;
esac
