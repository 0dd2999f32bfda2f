#!/usr/bin/env bash
# The two GPU commands, from the repository root of a copy on the GPU machine, on its own PyTorch.
#
#   bash benchmarks/gpu/commands.sh trainer OUT [--data DIR] [--kit KIT] [--budget SECONDS]
#       benchmarks/gpu/traces.py plain: main.py and DDP at batch 128 and 512 under torch.profiler
#       (OUT/traces/), then benchmarks/gpu/trainer_figures.py: data, airbench94 beside, accuracy,
#       time to its accuracy, speed; meanwhile Horovod builds against this PyTorch (scripts/setup.sh), at
#       the lowest priority on a quarter of the cores, and its wheel, stripped of debug
#       information, is left in OUT
#   bash benchmarks/gpu/commands.sh ports OUT [--kit KIT] [--budget SECONDS] [gpu_check.py flags]
#       Horovod's wheel from OUT (or a build), benchmarks/gpu/traces.py horovod (its three paths
#       under torch.profiler), then scripts/gpu_check.py's jobs (the ports beside main.py, its
#       paths, Horovod's levers, resumes, CUDA paths), merged into OUT/results-gpu.json, and the
#       allreduce probe on this GPU (tools/allreduce.py: the scaling model's terms), OUT/probe-gpu.json
#
# The traces are read on any machine afterwards: python -m benchmarks.gpu.trace_report OUT/traces
#
# --data DIR   real CIFAR-10 (default ./data, where `python main.py --download` puts it)
# --kit KIT    a folder for a machine without package registries: horovod-0.28.1.tar.gz, the
#              wheels Horovod's build lacks (cffi, pycparser) and airbench-0.1.8.tar.gz; without
#              it, pip fetches them
# --budget S   seconds the command may take (default: 900 for trainer, 600 for ports)
# --cpu-smoke  the same steps small, on the CPU, to try a command before spending GPU time on it
#              (ports then needs the set-up's .venv with Horovod)
set -uo pipefail
cd "$(dirname "$0")/../.."
usage() { echo "usage: bash benchmarks/gpu/commands.sh trainer|ports OUT [--data DIR] [--kit KIT] [--budget S]" >&2; exit 2; }
[ $# -ge 2 ] || usage
what=$1 out=$2
shift 2
data=data kit="" budget="" smoke=() py=python3
extra=()
while [ $# -gt 0 ]; do
    case $1 in
        --data) data=$2; shift 2 ;;
        --kit) kit=$(readlink -f "$2"); shift 2 ;;
        --budget) budget=$2; shift 2 ;;
        --cpu-smoke) smoke=(--cpu-smoke) py=.venv/bin/python; shift ;;
        *) extra+=("$1"); shift ;;
    esac
done
case $what in trainer) budget=${budget:-900} ;; ports) budget=${budget:-600} ;; *) usage ;; esac
export PYTHONUNBUFFERED=1 TORCH=system PYTHON=python3 CIFAR_HVD_CACHE=${CIFAR_HVD_CACHE:-$HOME/.cache/cifar-horovod}
airbench=()
if [ -n "$kit" ]; then
    export HOROVOD_SDIST=$kit/horovod-0.28.1.tar.gz WHEELS=$kit
    [ -f "$kit/airbench-0.1.8.tar.gz" ] && airbench=(--airbench "$kit/airbench-0.1.8.tar.gz")
fi
mkdir -p "$out"
if [ ${#smoke[@]} -eq 0 ]; then
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
fi
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
trainer)
    pin() { if command -v taskset >/dev/null; then taskset -c "$@"; else shift; "$@"; fi; }
    quarter=$((cores / 4 > 0 ? cores / 4 : 1))
    build=""
    if [ ${#smoke[@]} -eq 0 ]; then  # a smoke run keeps the machine's .venv as it is
        (pin "$((cores - quarter))-$((cores - 1))" nice -n 19 bash scripts/setup.sh > "$out/horovod-build.log" 2>&1
         echo "setup exit $?" >> "$out/horovod-build.log") &
        build=$!
    fi
    # a third of the budget to look inside a step, the rest to the figures; a tenth of it left for
    # the build to end and its wheel to be packed
    pin "0-$((cores - quarter - 1))" "$py" -m benchmarks.gpu.traces "$out" plain --budget "$((budget / 3))" "${smoke[@]}" \
        2>&1 | tee "$out/traces.log"
    pin "0-$((cores - quarter - 1))" "$py" -m benchmarks.gpu.trainer_figures --data "$data" "${airbench[@]}" \
        "${smoke[@]}" --out "$out/results-gpu.json" --budget "$((budget * 9 / 10 - 20 - (SECONDS - started)))" "${extra[@]}" \
        2>&1 | tee "$out/trainer.log"
    [ -n "$build" ] || exit 0
    while kill -0 "$build" 2>/dev/null && [ $((SECONDS - started)) -lt "$((budget - 15))" ]; do sleep 2; done
    tail -3 "$out/horovod-build.log"
    export_wheel
    ;;
ports)
    if ls "$out"/horovod-*.whl >/dev/null 2>&1 && [ -f "$out/horovod-wheel-dir.txt" ]; then
        # the trainer command's wheel, where setup.sh looks for a cached one
        mkdir -p "$CIFAR_HVD_CACHE/$(cat "$out/horovod-wheel-dir.txt")"
        cp "$out"/horovod-*.whl "$CIFAR_HVD_CACHE/$(cat "$out/horovod-wheel-dir.txt")/"
    fi
    if [ ${#smoke[@]} -eq 0 ]; then
        bash scripts/setup.sh > "$out/setup.log" 2>&1 || { tail -20 "$out/setup.log"; exit 1; }
        tail -2 "$out/setup.log"
    fi
    [ -f "$out/results-gpu.json" ] || cp benchmarks/results/results-gpu.json "$out/results-gpu.json"
    .venv/bin/python -m benchmarks.gpu.traces "$out" horovod --budget "$(((budget - (SECONDS - started)) * 2 / 5))" \
        "${smoke[@]}" \
        2>&1 | tee "$out/traces-horovod.log"
    [ ${#smoke[@]} -eq 0 ] || extra+=(--device cpu --quick --images 200 --only "bf16 --compile, regions")
    timeout "$((budget - (SECONDS - started) - 70))" .venv/bin/python -m scripts.gpu_check --no-setup \
        --images 50000 --merge "$out/results-gpu.json" --out "$out/gpu-check.json" "${extra[@]}" 2>&1 \
        | tee "$out/ports.log"
    # the scaling model's terms on this GPU: one step's time over many steps (the slowest of N),
    # the backward beside Horovod's allreduce (NCCL's kernels at size 1), a request's host cost
    probe=(--arch resnet18 --batch-size 128 --steps 300 --repeats 5)
    [ ${#smoke[@]} -eq 0 ] || probe=(--arch lenet --batch-size 8 --steps 5 --repeats 1)
    timeout "$((budget - (SECONDS - started) - 5))" .venv/bin/python -m tools.allreduce "${probe[@]}" \
        --json "$out/probe-gpu.json" 2>&1 | tee "$out/probe.log"
    ;;
esac
