# The trainer in a container image, on an existing PyTorch image (README, "Run in a container";
# docs/INSTALL.md#containers). Works with docker, podman and buildah.
#
#   make image                                   # on the NGC PyTorch image below
#   make image BASE=registry/pytorch-image:tag   # any image whose python3 imports torch and torchvision
#
# scripts/setup.sh (TORCH=system) builds Horovod against the base's PyTorch: with NCCL when the
# base has CUDA's compiler, for the GPUs in CUDA_CC; with gloo and MPI on a CPU base. The
# project's files are in /opt/cifar; runs start in /workspace (mount your folder there); the
# image runs as any UID (docker --user, Apptainer, OpenShift).
ARG BASE=nvcr.io/nvidia/pytorch:25.05-py3
FROM ${BASE}

# Compute capabilities to build Horovod's CUDA kernels for (80: A100, 90: H100 and H200).
ARG CUDA_CC=80,90
# The base's Python, the one whose torch is used.
ARG PYTHON=python3
# A folder holding (or to hold) Horovod wheels built earlier, mounted into the build
# (podman build -v DIR:/horovod-cache --build-arg HOROVOD_WHEEL_CACHE=/horovod-cache): a
# rebuild then skips Horovod's 3-8 minute compile. Empty: built here and not kept.
ARG HOROVOD_WHEEL_CACHE=

ARG DEBIAN_FRONTEND=noninteractive
# Containers usually run as root, which Open MPI refuses unless told.
ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# ssh client and server, for runs across nodes; only where the base lacks them.
RUN if ! command -v ssh >/dev/null || [ ! -x /usr/sbin/sshd ]; then \
        apt-get update -qq \
        && apt-get install -y -qq --no-install-recommends openssh-client openssh-server >/dev/null \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && mkdir -p /run/sshd
# A user of UID 1000 where the base has none: ssh and sshd need a name for the UID they run as
# (the Kubernetes manifests of deploy/kubernetes run the pods as UID 1000).
RUN getent passwd 1000 >/dev/null || useradd --uid 1000 --user-group --create-home --shell /bin/bash cifar

WORKDIR /opt/cifar
# `make setup TORCH=system`, as setup.sh itself (a base may lack make), before the rest of the
# project is copied, so that changing the trainer's code does not rebuild Horovod.
COPY requirements.txt ./
COPY scripts/setup.sh scripts/setup.sh
RUN set -e; \
    if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then \
        export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_BUILD_CUDA_CC_LIST="$CUDA_CC"; \
    fi; \
    cache=${HOROVOD_WHEEL_CACHE:-/tmp/horovod-wheels}; \
    CIFAR_HVD_CACHE="$cache" TORCH=system PYTHON="$PYTHON" bash scripts/setup.sh; \
    if [ -z "$HOROVOD_WHEEL_CACHE" ]; then rm -rf "$cache"; fi; \
    rm -rf /var/lib/apt/lists/* /root/.cache/pip

COPY . .
# Readable by every UID (only what a private umask left unreadable is changed, so no file is
# copied into another layer); /workspace writable by every UID, as /tmp is.
RUN find /opt/cifar \( ! -perm -a+r -o -type d ! -perm -a+x \) -exec chmod a+rX {} + \
    && mkdir -p -m 1777 /workspace

ENV PATH=/opt/cifar/.venv/bin:$PATH \
    MPLCONFIGDIR=/tmp/matplotlib
WORKDIR /workspace
CMD ["python", "/opt/cifar/main_horovod.py", "--help"]
