# ckptlib's tests on the torch the service's guide pins (torch==2.12.1), in a venv of its own under
# var/ (.venv keeps torch 2.13.0). Only PyPI is reachable: its Linux x86_64 torch 2.12.1 wheel is a
# CUDA 13 build, 532 MB, which does not import without its nvidia-*/triton dependencies
# (libcudnn.so.9); with them the download is 2.6 GB (about 6 GB installed). It runs on the CPU.
# With it the guide's transformers==5.10.2, accelerate, datasets and DeepSpeed 0.19.8 (all from PyPI).
# Use: `make -f ckptlib/tests/torch_pin.mk test-ckptlib-torch212` (.ci/run does, after the suite).
TORCH_PIN ?= 2.12.1
TRANSFORMERS_PIN ?= 5.10.2
TORCH_PIN_VENV ?= var/torch$(subst .,,$(TORCH_PIN))-venv

$(TORCH_PIN_VENV)/.stamp:
	python3.11 -m venv $(TORCH_PIN_VENV)
	$(TORCH_PIN_VENV)/bin/pip install --quiet torch==$(TORCH_PIN) numpy safetensors pytest \
		transformers==$(TRANSFORMERS_PIN) accelerate datasets deepspeed==0.19.8
	touch $@

# ckptlib importable in every process of the venv, whatever PYTHONPATH a test gives its children
# (a job's gets only the vendor dir): a .pth naming a folder that holds just ckptlib, as the
# default image's .pth does for the mounted /opt/ckptlib.
$(TORCH_PIN_VENV)/.ckptlib-pth: $(TORCH_PIN_VENV)/.stamp
	mkdir -p $(TORCH_PIN_VENV)/ckptlib-src
	ln -sfn $(CURDIR)/ckptlib $(TORCH_PIN_VENV)/ckptlib-src/ckptlib
	echo "$(CURDIR)/$(TORCH_PIN_VENV)/ckptlib-src" > "$$($(TORCH_PIN_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/ckptlib-src.pth"
	touch $@

# DeepSpeed's in-place experiment (test_deepspeed.py: 12 cases of 100 tags, 107 s of a CI run's
# 616 s libraries lane) runs whole on the suite's torch; here every case with 25 tags.
TORCH_PIN_INPLACE_TAGS ?= 25

# The whole ckptlib suite, slow tests included, from the ckptlib directory alone (-c /dev/null,
# --confcutdir: the root conftest needs Django).
test-ckptlib-torch212: $(TORCH_PIN_VENV)/.ckptlib-pth
	$(TORCH_PIN_VENV)/bin/python -c "import torch, transformers; assert torch.__version__.startswith('$(TORCH_PIN)'), torch.__version__; assert transformers.__version__ == '$(TRANSFORMERS_PIN)', transformers.__version__"
	DS_INPLACE_TAGS=$(TORCH_PIN_INPLACE_TAGS) $(TORCH_PIN_VENV)/bin/python -m pytest -q -p no:cacheprovider -c /dev/null --rootdir=ckptlib \
		--confcutdir=ckptlib -o "markers=slow: starts real processes" -o tmp_path_retention_policy=failed $(TORCH_PIN_PYTEST_ARGS) ckptlib

.PHONY: test-ckptlib-torch212
