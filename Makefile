# The two commands a fresh machine needs are `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
DEMO_DIR := checkpoint/demo

GPU_PYTHON ?= python3

.PHONY: setup demo test lint gpu-check image
# TORCH=system PYTHON=/path/to/python: use that Python's torch and torchvision (docs/INSTALL.md).
setup:
	bash scripts/setup.sh

# Two Horovod processes (gloo) on generated CIFAR-format data.
demo: setup
	$(VENV)/bin/horovodrun -np 2 --gloo $(PY) main_horovod.py --dataset synthetic --arch lenet \
		--epochs 8 --lr 0.05 --warmup-epochs 1 --checkpoint-dir $(DEMO_DIR) --overwrite
	@echo "demo outputs: $(DEMO_DIR)/{ckpt.pth,best.pth,metrics.csv,curves.svg,tb/}"

# Two workers (tests/conftest.py says which tests share one), then the tests that time
# something, alone; it fails if either fails. The slowest tests are listed at the end.
test: setup
	$(PY) -m pytest -q -n 2 --durations=15 -m "not alone" tests; s=$$?; \
	$(PY) -m pytest -q -m alone tests && exit $$s

# ruff (pyproject.toml): line length, import order, unused names. `python -m ruff` finds it in
# .venv, or in the other Python's folders of a TORCH=system set-up.
lint: setup
	$(PY) -m ruff check .

# On a GPU machine: set up against its PyTorch, then short real jobs, one line each with images/s;
# ARGS= more flags of scripts/gpu_check.py (ARGS="--only TEXT").
gpu-check:
	@python3 -m scripts.gpu_check --python $(GPU_PYTHON) $(ARGS)

# The container image (Dockerfile): BASE= another PyTorch image, CONTAINER=podman to build
# with podman, BUILD_FLAGS= more flags for the build.
IMAGE ?= cifar-horovod
CONTAINER ?= docker
image:
	$(CONTAINER) build -t $(IMAGE) $(if $(BASE),--build-arg BASE=$(BASE)) $(BUILD_FLAGS) .
