# The two commands a new user needs: `make up` (install + run the local stack) and `make test`.
PY ?= python3
.PHONY: setup up test lint protos

setup:
	bash scripts/setup.sh

up: setup
	zipkv up

test: setup
	ZIPKV_SGLANG_SRC=$${ZIPKV_SGLANG_SRC:-$(CURDIR)/.cache/sglang-0.5.17} $(PY) -m pytest -q

lint:
	ruff check . && ruff format --check . && mypy controlplane worker kernels allocator protos stack testing bench

protos:
	$(PY) -m zipkv.protos.generate
