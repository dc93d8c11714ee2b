# `make demo` needs only the main venv (.venv with lmdata). `make test` adds the dev tools, torch and
# the interop-test tools: zarr-python 2, mosaicml-streaming (with CPU torch) and datasketch in
# their own small venvs, and Debian's chromium for the viewer's browser tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DEV_STAMP := $(VENV)/.installed-dev-stamp
TEST_STAMP := $(VENV)/.installed-test-stamp
ZARR2 := $(VENV)/extra-zarr2
STREAMING := $(VENV)/extra-streaming
DATASKETCH := $(VENV)/extra-datasketch
CHROMIUM := /usr/bin/chromium

.PHONY: install install-main install-dev demo test typecheck docs docs-serve bench bench-quick bench-storage bench-envs lint format clean

# everything (the main venv, dev tools, interop-test tools)
install: $(TEST_STAMP)
install-main: $(STAMP)
install-dev: $(DEV_STAMP)

# the main venv: lmdata and its dependencies, all `make demo` needs
# (the C extensions' sources: any change rebuilds them; a build older than its sources is
# reported and not used, see lmdata/_native/__init__.py)
NATIVE_SOURCES := $(wildcard lmdata/_native/*.c lmdata/_native/*.h) lmdata/_native/_sources.py
$(STAMP): pyproject.toml setup.py Makefile $(NATIVE_SOURCES)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	@$(BIN)/python -m lmdata._native  # which C extensions were built, what runs without the rest
	touch $(STAMP)

# dev tools: pytest, hypothesis, ruff, zarr-python 3, playwright (Python side only), matplotlib,
# mkdocs with mkdocs-material and mkdocstrings (the documentation site)
$(DEV_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,plot]'
	touch $(DEV_STAMP)

$(TEST_STAMP): $(DEV_STAMP)
	# CPU torch from local disk, for the Loader's DataLoader tests (an unpinned torch pulls GBs),
	# and torchdata (the torch extra's) for the StatefulDataLoader resume tests, in one resolve
	# so that the torch pin holds
	$(BIN)/python -m pip install -q torch==2.13.0 torchdata==0.11.0
	# plain ray (not ray[default]: no dashboard deps) for the Ray engine's tests; jq for the
	# jq programs of modalities' jq_pattern and dolma's filters; jax (CPU) for the test that
	# it takes the Loader's batches without a copy; gigatoken for tokenize's fast encoder
	$(BIN)/python -m pip install -q -e '.[ray,jq,jax,fast]'
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
	# datasketch 2.0.0 (and rensa, for the benchmark's signature rows) in their own small venv:
	# tests/dolma/test_minhash_datasketch.py compares MinHash dedupe's quality with its MinHashLSH
	test -x $(DATASKETCH)/bin/python || $(PY) -m venv $(DATASKETCH)
	$(DATASKETCH)/bin/python -m pip install -q datasketch==2.0.0 rensa==0.5.0
	# Debian's chromium for the viewer's browser tests, driven by Playwright's Python package
	# (never `playwright install`); without root or apt those tests are skipped with a message
	test -x $(CHROMIUM) || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
		else \
			echo "note: $(CHROMIUM) missing (not root or no apt-get): browser tests will skip;" \
				"install it with: apt-get install chromium"; \
		fi; }
	touch $(TEST_STAMP)

demo: $(STAMP)
	$(BIN)/lmdata demo --out demo-output

# two processes (pytest-xdist): the suite waits on subprocesses, Ray and S3 as much as it
# computes, and on a loaded machine each process gets its share of the cores. A file's tests
# stay in one process (--dist loadfile): module fixtures are built once. Then the tests marked
# `native` (paths with a C twin in lmdata/_native/) run again without the extensions, so that
# the pure-Python paths a machine without a compiler runs are tested too (only the files that
# carry the mark are collected). The type check first (CI runs `make test`): a seam typed
# wrong fails before the suite runs.
test: $(TEST_STAMP) typecheck
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile
	LMDATA_PURE_PYTHON=1 $(BIN)/python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -m native \
		$$(grep -rl --include='test_*.py' 'pytest.mark.native' tests)

# mypy on the seams (the files of [tool.mypy] in pyproject.toml)
typecheck: $(DEV_STAMP)
	$(BIN)/mypy

# the documentation site from docs/ (mkdocs.yml) into site/; --strict: a broken link, a page
# left out of the nav or a docstring mkdocstrings cannot render fails the build (offline)
docs: $(DEV_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

docs-serve: $(DEV_STAMP)  # the same site on http://127.0.0.1:8000, rebuilt on every change
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs serve

# Origin tools (dolma, modalities, streaming, zarr 2/3) live in side venvs .venv/bench-<tool>/,
# created on first use and reused (bench/envs.py); results go to bench/results/ (gitignored).
bench: $(TEST_STAMP)
	PYTHONPATH=$(CURDIR) $(BIN)/python bench/run.py --update-docs

bench-quick: $(TEST_STAMP)
	PYTHONPATH=$(CURDIR) $(BIN)/python bench/run.py --quick

bench-storage: $(TEST_STAMP)  # object storage alone (also part of `make bench`)
	PYTHONPATH=$(CURDIR) $(BIN)/python bench/run.py storage

bench-envs: $(TEST_STAMP)
	$(BIN)/python bench/envs.py

lint: $(DEV_STAMP) typecheck
	$(BIN)/ruff check lmdata tests bench docs/hooks
	$(BIN)/ruff format --check lmdata tests bench docs/hooks

format: $(DEV_STAMP)
	$(BIN)/ruff format lmdata tests bench docs/hooks
	$(BIN)/ruff check --fix lmdata tests bench docs/hooks

clean:
	rm -rf $(VENV) demo-output .pytest_cache site
