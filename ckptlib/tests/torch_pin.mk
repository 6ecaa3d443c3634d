# ckptlib's tests on the torch the service's guide pins (torch==2.12.1), in a venv of its own under
# var/ (.venv keeps torch 2.13.0). Only PyPI is reachable: its Linux x86_64 torch 2.12.1 wheel is a
# CUDA 13 build, 532 MB, which does not import without its nvidia-*/triton dependencies
# (libcudnn.so.9); with them the download is 2.6 GB (about 6 GB installed). It runs on the CPU.
# Use: `make -f ckptlib/tests/torch_pin.mk test-ckptlib-torch212` (or include this file).
TORCH_PIN ?= 2.12.1
TORCH_PIN_VENV ?= var/torch$(subst .,,$(TORCH_PIN))-venv

$(TORCH_PIN_VENV)/.stamp:
	python3.11 -m venv $(TORCH_PIN_VENV)
	$(TORCH_PIN_VENV)/bin/pip install --quiet torch==$(TORCH_PIN) numpy safetensors pytest pytest-xdist
	touch $@

# The ckptlib directory alone (-c /dev/null, --confcutdir): the root conftest needs Django.
test-ckptlib-torch212: $(TORCH_PIN_VENV)/.stamp
	$(TORCH_PIN_VENV)/bin/python -c "import torch; assert torch.__version__.startswith('$(TORCH_PIN)'), torch.__version__"
	$(TORCH_PIN_VENV)/bin/python -m pytest -q -p no:cacheprovider -c /dev/null --rootdir=ckptlib --confcutdir=ckptlib \
		-m "not slow" ckptlib

.PHONY: test-ckptlib-torch212
