#!/usr/bin/env bash
# One idempotent set-up for a fresh Debian machine (run as root, or with sudo):
#   Open MPI from Debian, .venv with pinned PyTorch, and Horovod 0.28.1 built
#   from its sdist with the fixes it needs on current PyTorch (see README).
# A second run reuses everything and takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

HOROVOD_VERSION=0.28.1
UV_VERSION=0.13.9
PYTHON=${PYTHON:-python3.11}
VENV=.venv
CACHE=${CIFAR_HVD_CACHE:-$HOME/.cache/cifar-horovod}

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# --- Open MPI and build tools from Debian ------------------------------------
need_apt=()
for pkg in openmpi-bin libopenmpi-dev cmake g++ make; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || die "need root (or sudo) to apt-get install ${need_apt[*]}"
        SUDO=sudo
    fi
    log "apt-get install ${need_apt[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# --- Python environment -------------------------------------------------------
command -v "$PYTHON" >/dev/null || die "$PYTHON not found; install Python 3.11 or set PYTHON=/path/to/python3.11"
if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
# Pinned torch/torchvision come from the registry: the CPU-only torch wheel some
# machines keep locally makes `import torchvision` fail (torchvision::nms).
req_stamp="$VENV/requirements.sha256"
if [ "$(cat "$req_stamp" 2>/dev/null)" != "$(sha256sum requirements.txt)" ]; then
    log "installing requirements.txt with uv"
    # uv installs the 5 GB of CUDA-enabled torch from its cache in seconds where
    # pip takes minutes; it also ignores pip's local wheel folders.
    "$PY" -m pip install -q "uv==$UV_VERSION"
    "$PY" -m uv pip install --python "$PY" -q -r requirements.txt
    sha256sum requirements.txt > "$req_stamp"
fi

# --- Horovod ------------------------------------------------------------------
TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
PYTAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
GPU_OPS=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    GPU_OPS=NCCL
fi
FLAVOUR=${GPU_OPS:+nccl}
FLAVOUR=${FLAVOUR:-cpu}
WHEEL_DIR="$CACHE/horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-$PYTAG-$FLAVOUR"

installed_ok() {
    "$PY" - "$HOROVOD_VERSION" "$WHEEL_DIR" <<'PY' 2>/dev/null
import os, sys
import horovod, horovod.torch  # noqa: F401
stamp = os.path.join(sys.prefix, "horovod-build.txt")
sys.exit(0 if horovod.__version__ == sys.argv[1]
         and os.path.exists(stamp) and open(stamp).read().strip() == sys.argv[2] else 1)
PY
}

if installed_ok; then
    log "horovod $HOROVOD_VERSION already installed ($FLAVOUR, torch $TORCH_VERSION)"
else
    if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
        log "building horovod $HOROVOD_VERSION from sdist ($FLAVOUR, torch $TORCH_VERSION); takes 3-8 min on 2 cores"
        work=$(mktemp -d)
        trap 'rm -rf "$work"' EXIT
        if [ -n "${HOROVOD_SDIST:-}" ]; then
            cp "$HOROVOD_SDIST" "$work/"
        else
            "$PY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
                "horovod==$HOROVOD_VERSION" -d "$work"
        fi
        tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
        src="$work/horovod-$HOROVOD_VERSION"
        # Fix 1: PyTorch >= 2.1 needs C++17 and 2.14 needs C++20. Raise the
        # standard in BOTH files: raising only torch's gives a duplicate gloo
        # symbol at link time (gloo built as C++14, the torch part as C++20).
        sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 20/' \
            "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
        grep -q 'CMAKE_CXX_STANDARD 20' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt" \
            || die "could not patch the C++ standard in horovod's CMakeLists.txt"
        # Fix 2: CMake >= 4 refuses the bundled gloo's cmake_minimum_required(2.8.12).
        export CMAKE_POLICY_VERSION_MINIMUM=3.5
        # Fix 3: /usr/local/bin/nvcc may be a wrapper that misleads FindCUDAToolkit.
        if [ -d /usr/local/cuda/bin ]; then
            export CUDA_HOME=/usr/local/cuda PATH="/usr/local/cuda/bin:$PATH"
        fi
        export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
               HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
        if [ -n "$GPU_OPS" ]; then
            export HOROVOD_GPU_OPERATIONS=NCCL
            if [ -z "${HOROVOD_NCCL_HOME:-}" ]; then
                nccl=$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
                [ -n "$nccl" ] && export HOROVOD_NCCL_HOME="$nccl"
            fi
        fi
        export MAKEFLAGS="-j$(nproc)"
        mkdir -p "$WHEEL_DIR"
        # Fix 4: no build isolation, so the build sees the installed torch.
        "$PY" -m pip wheel -q --no-deps --no-build-isolation "$src" -w "$work/wheel"
        mv "$work"/wheel/horovod-*.whl "$WHEEL_DIR/"
    else
        log "using cached wheel in $WHEEL_DIR"
    fi
    "$PY" -m pip install -q --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
    echo "$WHEEL_DIR" > "$VENV/horovod-build.txt"
fi

# --- Verify -------------------------------------------------------------------
check=$("$VENV/bin/horovodrun" --check-build 2>&1) || die "horovodrun --check-build failed: $check"
for fw in PyTorch Gloo MPI; do
    printf '%s\n' "$check" | grep -Eq "\[X\] $fw" || die "horovod was built without $fw:
$check"
done
"$PY" -c 'import torch, torchvision; torchvision.ops.nms' || die "torchvision does not import against torch"
log "ok: torch $TORCH_VERSION, horovod $HOROVOD_VERSION with PyTorch, Gloo and MPI ($FLAVOUR)"
