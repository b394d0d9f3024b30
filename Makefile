# minigpt — `make help` lists every target. Pass Hydra overrides with ARGS="...".
PY      := .venv/bin/python
ARGS    ?=
NPROC   ?= 2
TORCH_CPU := torch==2.13.0

.DEFAULT_GOAL := help
.PHONY: help install test lint train generate tensorboard bench train-ddp prepare ablation

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-12s %s\n", $$1, $$2}'

.venv/installed: pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	# A bare `torch` requirement can pull a multi-GB CUDA build; put the CPU build in place first
	# where no torch is importable (users with their own torch keep it).
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_CPU)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: .venv/installed ## create .venv (if missing) and install minigpt with its dev tools

test: install ## run the whole test suite
	$(PY) -m pytest

lint: install ## ruff check
	$(PY) -m ruff check .

prepare: install ## tokenise the default corpus (train does this on first use)
	$(PY) scripts/prepare_data.py $(ARGS)

train: install ## train the default tiny model on CPU for a few minutes, then sample from it
	$(PY) scripts/train.py $(ARGS)

train-ddp: install ## train with DDP on NPROC processes (gloo on CPU, nccl on CUDA)
	.venv/bin/torchrun --standalone --nproc_per_node=$(NPROC) scripts/train.py $(ARGS)

generate: install ## sample from the latest training run
	$(PY) scripts/generate.py $(ARGS)

tensorboard: install ## serve TensorBoard over outputs/
	.venv/bin/tensorboard --logdir outputs --bind_all

bench: install ## measure training and generation speed against the reference
	$(PY) scripts/bench.py $(ARGS)

# The ablation lab: every file of configs/experiment/ablation/ (a test checks the list), the baseline first
# (job 0, the row the others are compared with), as one Hydra multirun into one sweep folder; then the
# report on it. The order here is the order of the table.
comma := ,
ABLATIONS := baseline no_causal_mask no_attn_scale integer_positions no_positions no_residual no_final_norm post_norm
ifndef ABLATION_DIR
ABLATION_DIR := outputs/ablation/$(shell date +%Y-%m-%d/%H-%M-%S)
endif

ablation: install ## train the baseline and each ablation (~6 min on 2 idle CPU cores), then report; UPDATE_README=1 also updates the README
	$(PY) scripts/train.py -m experiment=$(subst $() ,$(comma),$(addprefix ablation/,$(ABLATIONS))) \
		hydra.sweep.dir=$(ABLATION_DIR) 'hydra.sweep.subdir=$${hydra.job.num}_$${run_name}' $(ARGS)
	$(PY) scripts/ablation_report.py $(ABLATION_DIR) $(if $(UPDATE_README),--readme README.md)
