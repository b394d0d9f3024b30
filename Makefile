# minigpt — `make help` lists every target. Pass Hydra overrides with ARGS="...".
PY      := .venv/bin/python
ARGS    ?=
NPROC   ?= 2
HOST    ?= localhost# where `make tensorboard` listens; HOST=0.0.0.0 serves every network the machine is on
PORT    ?= 6006
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX ?=# e.g. https://download.pytorch.org/whl/cpu: PyTorch's CPU-only build instead of pip's default

.DEFAULT_GOAL := help
.PHONY: help install test test-fast lint train generate tensorboard bench train-ddp prepare docs speedrun ablation \
	device-wheels

# The `## ` comments are read from this file as text, so a variable named in one is filled in here.
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/$$(DEVICE_PYTHON)/$(DEVICE_PYTHON)/g' \
		| awk 'BEGIN {FS = ":.*## "}; {printf "  make %-14s %s\n", $$1, $$2}'

.venv/installed: pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	# The tested torch first, where none is importable (a torch already in .venv is kept): a bare range
	# would take pip's newest build, on Linux a multi-GB CUDA one.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_SPEC) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: .venv/installed ## create .venv (if missing) and install minigpt with its dev tools

test: install ## run the whole test suite
	$(PY) -m pytest

test-fast: install ## the inner loop: every test that starts no process and trains nothing, on 2 workers
	$(PY) -m pytest -m "not slow" -n 2

lint: install ## ruff check
	$(PY) -m ruff check .

prepare: install ## tokenise the default corpus (train does this on first use)
	$(PY) scripts/prepare_data.py $(ARGS)

train: install ## train the default model (model=demo) for a few minutes on CPU, then sample from it
	$(PY) scripts/train.py $(ARGS)

train-ddp: install ## train with DDP on NPROC processes (gloo on CPU, nccl on CUDA)
	.venv/bin/torchrun --standalone --nproc_per_node=$(NPROC) scripts/train.py $(ARGS)

generate: install ## sample from the latest training run
	$(PY) scripts/generate.py $(ARGS)

tensorboard: install ## serve TensorBoard over outputs/ on localhost (HOST=0.0.0.0 to expose it, PORT=6006)
	.venv/bin/tensorboard --logdir outputs --host $(HOST) --port $(PORT)

bench: install ## measure training and generation speed against Hugging Face's GPT-2 (docs/performance.md)
	$(PY) scripts/bench.py $(ARGS)

speedrun: install ## the CPU speedrun: train candidate configs for a fixed time each, tabulate them in docs/speedrun.md
	$(PY) scripts/speedrun.py $(ARGS)

docs: install ## regenerate what the tools write under docs/ (tests/project/test_docs.py keeps it current)
	$(PY) scripts/update_docs.py

# The ablation lab: every file of configs/experiment/ablation/ (a test checks the list), the baseline first
# (job 0, the row the others are compared with), as one Hydra multirun into one sweep folder; then the
# report on it. The order here is the order of the table.
comma := ,
ABLATIONS := baseline no_causal_mask no_attn_scale integer_positions no_positions no_residual no_final_norm post_norm
ifndef ABLATION_DIR
ABLATION_DIR := outputs/ablation/$(shell date +%Y-%m-%d/%H-%M-%S)
endif

ablation: install ## train the baseline and each ablation, then report; UPDATE_DOCS=1 also rewrites docs/ablation.md
	$(PY) scripts/train.py -m experiment=$(subst $() ,$(comma),$(addprefix ablation/,$(ABLATIONS))) \
		hydra.sweep.dir=$(ABLATION_DIR) 'hydra.sweep.subdir=$${hydra.job.num}_$${run_name}' $(ARGS)
	$(PY) scripts/ablation_report.py $(ABLATION_DIR) $(if $(UPDATE_DOCS),--readme docs/ablation.md)

# A CUDA machine without network whose image has torch, tiktoken, safetensors, tensorboard, transformers,
# matplotlib and tqdm (and their own requirements: numpy, PyYAML, packaging) lacks these: their wheels travel in
# .whl/ (git-ignored) and scripts/device_check.sh installs them offline. The versions are this .venv's, which
# the suite passed with. antlr4-python3-runtime 4.9.x (hydra-core's pin) exists on PyPI as source only, so its
# pure-Python wheel is built here.
DEVICE_WHEELS   ?= .whl
DEVICE_PYTHON   ?= 3.12
DEVICE_PACKAGES := hydra-core omegaconf rustbpe
DEVICE_SOURCE_PACKAGES := antlr4-python3-runtime
DEVICE_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
PINS = $(PY) -c "import sys; from importlib.metadata import version; print(' '.join(f'{p}=={version(p)}' for p in sys.argv[1:]))"

device-wheels: install ## wheels a CUDA image without Hydra needs (Python $(DEVICE_PYTHON), manylinux x86-64) -> .whl/
	rm -rf $(DEVICE_WHEELS) && mkdir -p $(DEVICE_WHEELS)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version $(DEVICE_PYTHON) --implementation cp \
	  $(addprefix --platform ,$(DEVICE_PLATFORMS)) -d $(DEVICE_WHEELS) $$($(PINS) $(DEVICE_PACKAGES))
	$(PY) -m pip wheel -q --no-deps -w $(DEVICE_WHEELS) $$($(PINS) $(DEVICE_SOURCE_PACKAGES))
	@ls $(DEVICE_WHEELS)
