# The two commands a fresh machine needs are `make demo` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
DEMO_DIR := checkpoint/demo

.PHONY: setup demo test
setup:
	bash scripts/setup.sh

# Two Horovod processes (gloo) on generated CIFAR-format data.
demo: setup
	$(VENV)/bin/horovodrun -np 2 --gloo $(PY) main_horovod.py --dataset synthetic --arch lenet \
		--epochs 8 --lr 0.05 --warmup-epochs 1 --checkpoint-dir $(DEMO_DIR) --overwrite
	@echo "demo outputs: $(DEMO_DIR)/{ckpt.pth,best.pth,metrics.csv,curves.png,tb/}"

test: setup
	$(PY) -m pytest -q tests
