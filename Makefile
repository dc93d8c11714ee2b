# Everything the tests, the demo and the benchmarks need is installed into .venv by `make install`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
ZARR2 := $(VENV)/extra-zarr2
STREAMING := $(VENV)/extra-streaming

.PHONY: install demo test bench bench-quick bench-envs lint format clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	# CPU torch from local disk, for the Loader's DataLoader tests (an unpinned torch pulls GBs)
	$(BIN)/python -m pip install -q torch==2.13.0
	# zarr-python 2 lives in its own small venv: tests check that it reads what lmdata writes
	test -x $(ZARR2)/bin/python || $(PY) -m venv $(ZARR2)
	$(ZARR2)/bin/python -m pip install -q 'zarr>=2.18,<3' 'numcodecs<0.16'
	# mosaicml-streaming 0.13.0 (numpy<2.2, torch) in its own venv: the MDS interop tests run it,
	# and `$(STREAMING)/bin/python -c "from streaming import StreamingDataset"` works as is.
	# CPU torch from local disk; --no-deps skips the cloud SDKs (imported only for remote
	# paths) and torchvision, whose PyPI build cannot load beside CPU torch: a .pth line puts
	# the stand-in of tests/formats/streaming_standins.py in its place.
	test -x $(STREAMING)/bin/python || $(PY) -m venv $(STREAMING)
	$(STREAMING)/bin/python -m pip install -q torch==2.13.0 'numpy<2.2' Brotli python-snappy \
		'xxhash<4' zstd tqdm catalogue pillow 'transformers>=4.21.3,<5'
	$(STREAMING)/bin/python -m pip install -q --no-deps mosaicml-streaming==0.13.0
	$(STREAMING)/bin/python tests/formats/streaming_standins.py --install-into-venv
	touch $(STAMP)

demo: install
	$(BIN)/lmdata demo --out demo-output

test: install
	$(BIN)/python -m pytest -q -p no:cacheprovider

# Origin tools (dolma, modalities, streaming, zarr 2/3) live in side venvs .venv/bench-<tool>/,
# created on first use and reused (bench/envs.py); results go to bench/results/ (gitignored).
bench: install
	PYTHONPATH=$(CURDIR) $(BIN)/python bench/run.py

bench-quick: install
	PYTHONPATH=$(CURDIR) $(BIN)/python bench/run.py --quick

bench-envs: install
	$(BIN)/python bench/envs.py

lint: install
	$(BIN)/ruff check lmdata tests bench
	$(BIN)/ruff format --check lmdata tests bench

format: install
	$(BIN)/ruff format lmdata tests bench
	$(BIN)/ruff check --fix lmdata tests bench

clean:
	rm -rf $(VENV) demo-output .pytest_cache
