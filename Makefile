# Two commands do all set-up on a fresh Debian 12 machine: `make test` and `make demo`.
PY := .venv/bin/python
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: setup test demo bench clean
setup:
	bash scripts/setup.sh

test: setup
	$(PY) -m pytest -ra $(PYTEST_ARGS)

demo: setup
	$(PY) examples/demo.py $(DEMO_ARGS)

bench: setup
	$(PY) benchmarks/probe_overhead.py

clean:
	rm -rf .venv build *.egg-info
