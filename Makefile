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
	scaling compare device-wheels

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

test: install ## run the whole test suite, on 2 workers
	$(PY) -m pytest -n 2

test-fast: install ## the inner loop: every test that starts no process and trains nothing, on 2 workers
	$(PY) -m pytest -m "not slow" -n 2

lint: install ## ruff check
	$(PY) -m ruff check .

prepare: install ## tokenise the default corpus (train does this on first use)
	$(PY) scripts/prepare_data.py $(ARGS)

train: install ## train the default model (model=recipe) for a few minutes on CPU, then sample from it
	$(PY) scripts/train.py $(ARGS)

train-ddp: install ## train with DDP on NPROC processes (gloo on CPU, nccl on CUDA)
	.venv/bin/torchrun --standalone --nproc_per_node=$(NPROC) scripts/train.py $(ARGS)

generate: install ## sample from the latest training run
	$(PY) scripts/generate.py $(ARGS)

tensorboard: install ## serve TensorBoard over outputs/ on localhost (HOST=0.0.0.0 to expose it, PORT=6006)
	.venv/bin/tensorboard --logdir outputs --host $(HOST) --port $(PORT)

bench: install ## measure training and generation speed against Hugging Face's GPT-2 (docs/performance.md)
	$(PY) scripts/bench.py $(ARGS)

docs: install ## regenerate what the tools write under docs/ (tests/project/test_docs.py keeps it current)
	$(PY) scripts/update_docs.py

# The lab's sweeps: configs x SEEDS seeds (from FIRST_SEED) as one Hydra multirun of train.py into one sweep
# folder, the baseline config first (jobs 0 .. SEEDS-1: the rows the others are compared with, seed by seed),
# then the report on that folder. A launcher (ARGS="hydra/launcher=slurm ...") runs the same jobs elsewhere.
comma := ,
SEEDS ?= 3
FIRST_SEED ?= 1337
SEED_LIST = $(shell seq -s, $(FIRST_SEED) $$(( $(FIRST_SEED) + $(SEEDS) - 1 )))
SWEEP_SUBDIR := 'hydra.sweep.subdir=$${hydra.job.num}_$${run_name}_seed$${trainer.seed}'
sweep = $(PY) scripts/train.py -m experiment=$(subst $() ,$(comma),$(addprefix $(1)/,$(2))) \
	trainer.seed=$(SEED_LIST) hydra.sweep.dir=$(3) $(SWEEP_SUBDIR) $(ARGS)
STAMP := $(shell date +%Y-%m-%d/%H-%M-%S)

# The CPU speedrun: files of configs/experiment/speedrun/ (default: the baseline, the default run), all at the
# FLOPs budget of speedrun/default.yaml.
SPEEDRUN ?= default longer_cooldown six_layers modern previous_default
SPEEDRUN_DIR ?= outputs/speedrun/$(STAMP)

speedrun: install ## SPEEDRUN configs x SEEDS seeds (3) at equal FLOPs, then the table; UPDATE_DOCS=1: also docs/speedrun.md
	$(call sweep,speedrun,$(SPEEDRUN),$(SPEEDRUN_DIR))
	$(PY) scripts/speedrun.py sweep=$(SPEEDRUN_DIR) $(if $(UPDATE_DOCS),docs=true)

# The ablation lab: every file of configs/experiment/ablation/ (a test checks the list). The order here is
# the order of the table.
ABLATIONS := baseline no_causal_mask no_attn_scale integer_positions no_positions no_residual no_final_norm post_norm \
	batchnorm one_head dropout qk_norm relu2 zero_init_proj value_embeds smear bigram_embed logit_softcap muon embed_lr batch_warmup seq_len_warmup
ABLATION_DIR ?= outputs/ablation/$(STAMP)

ablation: install ## the baseline and each ablation x SEEDS seeds (3) at equal FLOPs, then the report; UPDATE_DOCS=1: also docs/ablation.md
	$(call sweep,ablation,$(ABLATIONS),$(ABLATION_DIR))
	$(PY) scripts/ablation_report.py sweep=$(ABLATION_DIR) $(if $(UPDATE_DOCS),docs=true)

# The scaling ladder: the IsoFLOP profiles of configs/scaling.yaml (sizes of configs/experiment/scaling/ at
# budgets of FLOPs, 2 seeds each), two runs at a time, then the fit of L(N, D) and the held-out check. Run it
# again to resume a stopped ladder (ARGS="out=outputs/scaling/<name>": another ladder).
scaling: install ## the IsoFLOP ladder, a fit of L(N, D) with bootstrap intervals, checked at a larger budget; UPDATE_DOCS=1: also docs/scaling.md
	$(PY) scripts/scaling.py $(if $(UPDATE_DOCS),docs=true) $(ARGS)

# A comparison decided by paired seeds: CANDIDATE against BASELINE, each a space-separated list of overrides of
# train.py (an experiment file, or keys), handed to scripts/compare.py as Hydra lists of quoted strings.
BASELINE ?= experiment=speedrun/default
CANDIDATE ?=
override_list = [$(subst $() ,$(comma),$(foreach o,$(1),"$(o)"))]

compare: install ## CANDIDATE vs BASELINE (train.py overrides), paired seeds until better/worse/equivalent (docs/comparisons.md)
	$(PY) scripts/compare.py 'baseline=$(call override_list,$(BASELINE))' 'candidate=$(call override_list,$(CANDIDATE))' $(ARGS)

# A CUDA machine without network whose image has torch, tiktoken, safetensors, tensorboard, transformers,
# matplotlib and tqdm (and their own requirements: numpy, PyYAML, packaging) lacks these: their wheels travel in
# .whl/ (git-ignored) and scripts/device_check.sh installs them offline. The versions are this .venv's, which
# the suite passed with. antlr4-python3-runtime 4.9.x (hydra-core's pin) exists on PyPI as source only, so its
# pure-Python wheel is built here.
DEVICE_WHEELS   ?= .whl
DEVICE_PYTHON   ?= 3.12
DEVICE_PACKAGES := hydra-core omegaconf rustbpe scipy
DEVICE_SOURCE_PACKAGES := antlr4-python3-runtime
DEVICE_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
PINS = $(PY) -c "import sys; from importlib.metadata import version; print(' '.join(f'{p}=={version(p)}' for p in sys.argv[1:]))"

device-wheels: install ## wheels a CUDA image without Hydra needs (Python $(DEVICE_PYTHON), manylinux x86-64) -> .whl/
	rm -rf $(DEVICE_WHEELS) && mkdir -p $(DEVICE_WHEELS)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version $(DEVICE_PYTHON) --implementation cp \
	  $(addprefix --platform ,$(DEVICE_PLATFORMS)) -d $(DEVICE_WHEELS) $$($(PINS) $(DEVICE_PACKAGES))
	$(PY) -m pip wheel -q --no-deps -w $(DEVICE_WHEELS) $$($(PINS) $(DEVICE_SOURCE_PACKAGES))
	@ls $(DEVICE_WHEELS)
