#!/usr/bin/env bash
# One idempotent set-up (run as root, or with sudo): Open MPI and build tools from
# Debian, .venv, and Horovod 0.28.1 built from its sdist with the fixes current
# PyTorch, gcc and CUDA need (docs/INSTALL.md#building-horovod-0281-against-current-pytorch).
# A second run takes seconds.
#
#   bash scripts/setup.sh                          # .venv with requirements.txt's pinned torch
#   TORCH=system PYTHON=/usr/bin/python3 bash scripts/setup.sh
#                                                  # .venv that uses that Python's torch and
#                                                  # torchvision (a GPU cluster's, an NGC image's)
#   HOROVOD_SDIST=horovod-0.28.1.tar.gz WHEELS=dir # offline: the sdist and a folder of wheels
#   HOROVOD_GPU_OPERATIONS=NCCL                    # build for GPUs where none is visible
#   HOROVOD_BUILD_CUDA_CC_LIST=80,90               # kernels for these GPUs (default: the local ones)
set -euo pipefail
cd "$(dirname "$0")/.."

HOROVOD_VERSION=0.28.1
UV_VERSION=0.13.9
VENV=.venv
CACHE=${CIFAR_HVD_CACHE:-$HOME/.cache/cifar-horovod}

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# Without TORCH, a .venv made for another Python's torch keeps it: `make test` after
# `make setup TORCH=system PYTHON=...` does not rebuild it on the pinned torch.
if [ -z "${TORCH:-}" ] && [ -f "$VENV/torch-mode.txt" ] \
        && read -r kept kept_python < "$VENV/torch-mode.txt" \
        && [ "$kept" = system ] && [ -x "$kept_python" ]; then
    TORCH=system PYTHON=${PYTHON:-$kept_python}
fi
TORCH=${TORCH:-pinned}
# The Pythons the pinned torch has wheels for and Horovod 0.28.1 builds on (tested: 3.11).
SUPPORTED="3.11 3.12 3.13"
first_supported() {
    local v
    for v in $SUPPORTED; do command -v "python$v" >/dev/null 2>&1 && { echo "python$v"; return; }; done
    echo python3
}
case "$TORCH" in
    pinned) PYTHON=${PYTHON:-$(first_supported)} ;;
    system) PYTHON=${PYTHON:-python3} ;;
    *) die "TORCH must be 'pinned' (the default) or 'system', not '$TORCH'" ;;
esac

# --- Open MPI and build tools from Debian ------------------------------------
apt_install() {
    local SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || return 1
        SUDO=sudo
    fi
    log "apt-get install $*"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
# Each is looked for as a command, so that an image's own Open MPI (NGC's HPC-X in
# /usr/local/mpi) is used rather than joined by Debian's.
missing=()
{ command -v mpirun && command -v mpicxx; } >/dev/null 2>&1 || missing+=(openmpi-bin libopenmpi-dev)
for tool in cmake g++ make; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
WITH_MPI=1
if [ ${#missing[@]} -gt 0 ] && ! apt_install "${missing[@]}"; then
    # Offline GPU machines often have the compilers but no Open MPI: Horovod then runs on gloo.
    for tool in cmake g++ make; do
        command -v "$tool" >/dev/null || die "could not apt-get install ${missing[*]}, and $tool is missing"
    done
    command -v mpicxx >/dev/null || { WITH_MPI=0; log "no Open MPI and no apt: building Horovod without MPI (gloo only)"; }
fi

# --- Python environment -------------------------------------------------------
command -v "$PYTHON" >/dev/null || die "$PYTHON not found; install Python 3.11, 3.12 or 3.13, or set PYTHON=/path/to/python"
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$TORCH" = pinned ] && [[ " $SUPPORTED " != *" $PYVER "* ]]; then
    die "$PYTHON is Python $PYVER; the pinned torch and Horovod need 3.11, 3.12 or 3.13: install one, set PYTHON=, or use TORCH=system"
fi
# Debian's Python makes a venv only with its python3.X-venv package.
make_venv() {
    "$PYTHON" -m venv "$@" "$VENV" 2>/dev/null && return
    rm -rf "$VENV"
    apt_install "python$PYVER-venv" || die "$PYTHON -m venv failed and python$PYVER-venv could not be installed"
    "$PYTHON" -m venv "$@" "$VENV" || die "$PYTHON -m venv failed"
}
PY="$VENV/bin/python"
mode_stamp="$VENV/torch-mode.txt"
want_mode=pinned
[ "$TORCH" = system ] && want_mode="system $(command -v "$PYTHON")"
have_mode=$(cat "$mode_stamp" 2>/dev/null || echo pinned)
if [ -x "$PY" ] && [ "$have_mode" != "$want_mode" ]; then
    log "$VENV was made for '$have_mode'; making it anew for '$want_mode'"
    rm -rf "$VENV"
fi

if [ "$TORCH" = system ]; then
    # This venv sees the other Python's packages through a .pth file (a venv made from a venv
    # or conda env would see only the base interpreter's), installs nothing that is there,
    # and shadows nothing. Its own pip is that Python's.
    "$PYTHON" -c 'import torch, torchvision' 2>/dev/null \
        || die "TORCH=system: $PYTHON cannot import torch and torchvision; install them there, or drop TORCH=system"
    if [ ! -x "$PY" ]; then
        log "creating $VENV on $PYTHON's torch"
        make_venv --without-pip
    fi
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # Each folder is added as a site folder, so that the .pth files in it run as they do for
    # that Python (setuptools' distutils shim, which Horovod's build needs on Python >= 3.12).
    "$PYTHON" - > "$site/_system_torch.pth" <<'PY'
import os, sys
seen = set()
for p in sys.path:  # that Python's own site folders, torch's among them
    if p.rstrip("/").endswith(("site-packages", "dist-packages")) and os.path.isdir(p) and p not in seen:
        seen.add(p)
        print(f"import site; site.addsitedir({p!r})")
PY
    "$PY" -m pip --version >/dev/null 2>&1 || die "TORCH=system: $PYTHON has no pip; install python3-pip there"
    PIP=("$PY" -m pip install -q)
    [ -n "${WHEELS:-}" ] && PIP+=(--no-index --find-links "$WHEELS")
    # Only what is missing: torch and torchvision are that Python's, mpi4py needs MPI.
    wanted=() need=() optional=()
    while read -r req; do
        name=${req%%[=<> ]*} && name=${name%%\[*}  # psycopg[binary]: the package psycopg
        # kubernetes-validate checks the Kubernetes manifests (tests/test_kubernetes.py), mlflow is
        # the tests' server (--mlflow needs only mlflow-skinny). A machine or an image that trains
        # does without them.
        case "$name" in
            torch|torchvision|kubernetes-validate|mlflow|'') continue ;;
            mpi4py) [ "$WITH_MPI" = 1 ] || continue ;;
        esac
        wanted+=("$req")
    done < <(grep -v '^\s*#' requirements.txt)
    # Which of them that Python lacks, in one start of it (each start loads its site folders).
    absent=$("$PY" - "${wanted[@]}" <<'PY'
import importlib.metadata as m, re, sys
for req in sys.argv[1:]:
    try:
        m.version(re.split(r"[=<> \[]", req, maxsplit=1)[0])
    except m.PackageNotFoundError:
        print(req)
PY
) || die "TORCH=system: $PY could not check which requirements it has (its error is above)"
    while read -r req; do
        # optuna serves main_sweep.py --search alone, psycopg its --storage, ruff `make lint`:
        # training goes on without them.
        case "$req" in '') ;; optuna*|psycopg*|ruff*) optional+=("$req") ;; *) need+=("$req") ;; esac
    done <<< "$absent"
    if [ ${#need[@]} -gt 0 ]; then
        log "installing what $PYTHON lacks: ${need[*]}"
        "${PIP[@]}" "${need[@]}"
    fi
    for req in ${optional[@]+"${optional[@]}"}; do
        "${PIP[@]}" "$req" 2>/dev/null \
            || log "$req is not installed (pip found no copy): main_sweep.py --search needs optuna, its --storage psycopg, make lint ruff; the rest runs without them"
    done
else
    if [ ! -x "$PY" ]; then
        log "creating $VENV on Python $PYVER"
        make_venv
    fi
    # Pinned torch/torchvision come from the registry: the CPU-only torch wheel some
    # machines keep locally makes `import torchvision` fail (torchvision::nms).
    req_stamp="$VENV/requirements.sha256"
    if [ "$(cat "$req_stamp" 2>/dev/null)" != "$(sha256sum requirements.txt)" ]; then
        log "installing requirements.txt with uv"
        # uv installs the 5 GB of CUDA-enabled torch from its cache in seconds where
        # pip takes minutes; it also ignores pip's local wheel folders.
        "$PY" -m pip install -q "uv==$UV_VERSION"
        # --compile-bytecode: every module's .pyc now, once. uv writes none by default, and a
        # Python run with PYTHONDONTWRITEBYTECODE=1 (as many CI images set) never writes them, so
        # each process compiled torch's modules anew: about 2.4 s more per start on 2 cores.
        "$PY" -m uv pip install --python "$PY" -q --compile-bytecode -r requirements.txt
        sha256sum requirements.txt > "$req_stamp"
    fi
fi
echo "$want_mode" > "$mode_stamp"

# --- Horovod ------------------------------------------------------------------
read -r TORCH_VERSION PYTAG < <("$PY" -c 'import sys, torch; print(torch.__version__, "cp%d%d" % sys.version_info[:2])')
GPU_OPS=${HOROVOD_GPU_OPERATIONS:-}
if [ -z "$GPU_OPS" ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    GPU_OPS=NCCL
fi
FLAVOUR=cpu
if [ -n "$GPU_OPS" ]; then
    # Kernels for this host's GPUs only (about 2 minutes instead of every architecture).
    if [ -z "${HOROVOD_BUILD_CUDA_CC_LIST:-}" ]; then
        HOROVOD_BUILD_CUDA_CC_LIST=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
            | tr -d . | sort -u | paste -sd, -) || true
        [ -n "$HOROVOD_BUILD_CUDA_CC_LIST" ] \
            || die "no GPU visible to choose kernels for: set HOROVOD_BUILD_CUDA_CC_LIST (e.g. 90 for H100)"
    fi
    export HOROVOD_BUILD_CUDA_CC_LIST
    FLAVOUR="nccl-cc${HOROVOD_BUILD_CUDA_CC_LIST//,/_}"
fi
[ "$WITH_MPI" = 1 ] || FLAVOUR="$FLAVOUR-nompi"
PATCHES=3  # raised whenever the fixes below change what is built
WHEEL_DIR="$CACHE/horovod-$HOROVOD_VERSION-p$PATCHES-torch${TORCH_VERSION//+/_}-$PYTAG-$FLAVOUR"

installed_ok() {
    "$PY" - "$HOROVOD_VERSION" "$WHEEL_DIR" <<'PY' 2>/dev/null
import os, sys
import horovod, horovod.torch  # noqa: F401
stamp = os.path.join(sys.prefix, "horovod-build.txt")
sys.exit(0 if horovod.__version__ == sys.argv[1]
         and os.path.exists(stamp) and open(stamp).read().strip() == sys.argv[2] else 1)
PY
}

build_wheel() {
    local work src nccl
    work=$(mktemp -d)
    trap 'rm -rf "$work"' RETURN
    if [ -n "${HOROVOD_SDIST:-}" ]; then
        cp "$HOROVOD_SDIST" "$work/"
    else
        "$PY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
            "horovod==$HOROVOD_VERSION" -d "$work"
    fi
    tar -xzf "$work"/horovod-"$HOROVOD_VERSION".tar.gz -C "$work"
    src="$work/horovod-$HOROVOD_VERSION"
    # Fix 1: PyTorch >= 2.1 needs C++17 and 2.14 needs C++20. Raise the standard in BOTH
    # files: raising only torch's gives a duplicate gloo symbol at link time.
    sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 20/' \
        "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 20' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt" \
        || die "could not patch the C++ standard in horovod's CMakeLists.txt"
    # Fix 2: CUDA 13's nvcc has no C++11 mode: the CUDA kernels are built as C++17.
    sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$src/horovod/common/ops/cuda/CMakeLists.txt"
    grep -q 'CMAKE_CUDA_STANDARD 17' "$src/horovod/common/ops/cuda/CMakeLists.txt" \
        || die "could not patch the CUDA standard in horovod/common/ops/cuda/CMakeLists.txt"
    # Fix 9: gloo's process-set contexts (the global one included) ignore --network-interface /
    # HOROVOD_GLOO_IFACE and bind to whatever the host name resolves to: on Debian's
    # "127.0.1.1 hostname" line, hvd.init() across hosts fails with "Connection refused".
    sed -i '/void GlooContext::InitializeForProcessSet/,/CreateDevice/ s/device_attr.iface = gloo_iface_;/gloo_iface_ = global_context.gloo_iface_;\n  device_attr.iface = gloo_iface_;/' \
        "$src/horovod/common/gloo/gloo_context.cc"
    grep -q 'gloo_iface_ = global_context.gloo_iface_;' "$src/horovod/common/gloo/gloo_context.cc" \
        || die "could not patch horovod/common/gloo/gloo_context.cc"
    # Release, not setup.py's RelWithDebInfo: the same -O3 without debug information, a
    # 1.5 MB wheel instead of 22 MB, and 136 s instead of 170 s on 2 cores. HOROVOD_DEBUG=1
    # still builds Debug.
    sed -i "s/else 'RelWithDebInfo'/else 'Release'/" "$src/setup.py"
    grep -q "else 'Release'" "$src/setup.py" || die "could not set the build type in horovod's setup.py"
    # Fix 3: gcc 13 no longer includes <string> and <cstdint> through other headers.
    export CXXFLAGS="${CXXFLAGS:-} -include string -include cstdint"
    # Fix 10: Horovod's CMake asks distutils for Python's headers; Python 3.12 has no distutils,
    # and without setuptools' shim the torch module's build then misses Python.h.
    export CPLUS_INCLUDE_PATH="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
    # Fix 4: CMake >= 4 refuses the bundled gloo's cmake_minimum_required(2.8.12).
    export CMAKE_POLICY_VERSION_MINIMUM=3.5
    # Fix 5: /usr/local/bin/nvcc may be a wrapper that misleads FindCUDAToolkit.
    if [ -d /usr/local/cuda/bin ]; then
        export CUDA_HOME=/usr/local/cuda PATH="/usr/local/cuda/bin:$PATH"
    fi
    # Fix 6: setup.py wants cffi at build time, and without build isolation pip fetches nothing.
    "$PY" -c 'import cffi' 2>/dev/null || die "cffi must be installed before Horovod is built"
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    if [ "$WITH_MPI" = 1 ]; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
    if [ -n "$GPU_OPS" ]; then
        export HOROVOD_GPU_OPERATIONS=NCCL
        if [ -z "${HOROVOD_NCCL_HOME:-}" ]; then
            # Fix 7: the nvidia-nccl-cu* wheel ships include/ and lib/libnccl.so.2 only; CMake
            # looks for libnccl.so. A folder of links gives it both.
            if nccl=$("$PY" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null); then
                mkdir -p "$work/nccl/lib"
                ln -s "$nccl/include" "$work/nccl/include"
                ln -s "$nccl/lib/libnccl.so.2" "$work/nccl/lib/libnccl.so.2"
                ln -s libnccl.so.2 "$work/nccl/lib/libnccl.so"
                export HOROVOD_NCCL_HOME="$work/nccl" HOROVOD_NCCL_LINK=SHARED
            elif [ -f /usr/include/nccl.h ]; then
                # A system NCCL (NGC images): CMake finds it in the default paths.
                export HOROVOD_NCCL_LINK=SHARED
            else
                die "HOROVOD_GPU_OPERATIONS=NCCL: no nvidia-nccl package and no /usr/include/nccl.h; set HOROVOD_NCCL_HOME"
            fi
        fi
    fi
    export MAKEFLAGS="-j$(nproc)"
    # Fix 8: no build isolation, so the build sees the installed torch.
    "$PY" -m pip wheel -q --no-deps --no-build-isolation "$src" -w "$work/wheel"
    mkdir -p "$WHEEL_DIR"
    mv "$work"/wheel/horovod-*.whl "$WHEEL_DIR/"
}

if installed_ok; then
    log "horovod $HOROVOD_VERSION already installed ($FLAVOUR, torch $TORCH_VERSION)"
else
    if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
        log "building horovod $HOROVOD_VERSION from sdist ($FLAVOUR, torch $TORCH_VERSION); takes 2-8 min on 2 cores"
        build_wheel
    else
        log "using cached wheel in $WHEEL_DIR"
    fi
    "$PY" -m pip install -q --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl
    echo "$WHEEL_DIR" > "$VENV/horovod-build.txt"
fi

# --- Verify -------------------------------------------------------------------
# One process imports torch once for every check (`horovodrun --check-build` imports it in a
# process per framework and operation: about 19 s of a 2-core machine's set-up).
"$VENV/bin/horovodrun" --version >/dev/null 2>&1 || die "$VENV/bin/horovodrun does not run"
check=$("$PY" - <<'PY'
import os
import torch
import torchvision
torchvision.ops.nms  # fails where torchvision's compiled ops do not match this torch
import horovod.torch as hvd
print(os.path.dirname(os.path.dirname(torch.__file__)))
print(" ".join(["PyTorch"] + [name for name, built in (("Gloo", hvd.gloo_built()), ("MPI", hvd.mpi_built())) if built]))
print(int(hvd.nccl_built()))
PY
) || die "torch, torchvision or horovod.torch does not import in $VENV (its error is above)"
{ read -r where; read -r built; read -r nccl_built; } <<< "$check"
want=(PyTorch Gloo)
[ "$WITH_MPI" = 1 ] && want+=(MPI)
for fw in "${want[@]}"; do
    [[ " $built " == *" $fw "* ]] || die "horovod was built without $fw (it has: $built); see the build log above"
done
if [ -n "$GPU_OPS" ]; then
    [ "$nccl_built" != 0 ] || die "horovod was built without NCCL (hvd.nccl_built() is 0); see the build log above"
    log "NCCL built in: hvd.nccl_built() = $nccl_built, kernels for compute capability $HOROVOD_BUILD_CUDA_CC_LIST"
fi
log "ok: torch $TORCH_VERSION from $where, horovod $HOROVOD_VERSION with ${want[*]} ($FLAVOUR)"
