# Set-up and checks. `make demo` and `make test` work on a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# One per core, 2 to 4: `make demo`'s profile processes (`hexiscale profile` needs two) and the
# suite's workers (pytest-xdist: one worker per core roughly halves the suite on 2 cores, where most
# tests are one busy process or wait on a timeout).
CORES_2_TO_4 := $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n > 4 ? 4 : (n < 2 ? 2 : n) )))

.PHONY: install demo example-hf test test-exhaustive test-fast bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first: 2.13.0 is a CPU build on local disk; a plain requirement would pull CUDA.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	# The product loop on this machine: measure it (one process per core, at most 4), plan a small
	# model on the cluster measured (layered plans: what `profile` measures the links for by
	# default), draw the plan, train it 12 steps (the first 2 are warm-up, left out of the timings)
	# and print the cost model's times against the run's, with their mean |error|.
	mkdir -p .demo && cp instances/demo/problem.yaml .demo/problem.yaml
	# A busy machine can make a fit meaningless (profile refuses it and says why): measure again, twice at most.
	for try in 1 2 3; do \
	  $(BIN)/hexiscale profile -o .demo/cluster.yaml --processes $(CORES_2_TO_4) --model demo-cpu --seq-len 128 --max-bytes 134217728 --repeats 5 --warmup 1 --rounds 8 && break; \
	  [ $$try -lt 3 ] || exit 1; echo "demo: the profile was refused (the line above says why); measuring again ($$try of 2 retries)"; \
	done
	$(BIN)/hexiscale solve .demo/problem.yaml --kind layered -o .demo/plan.json
	$(BIN)/hexiscale show .demo/problem.yaml .demo/plan.json -o .demo/pictures
	$(BIN)/hexiscale run .demo/problem.yaml .demo/plan.json --model problem --steps 12 --out .demo/run

# a Hugging Face model made here (transformers + tokenizers, nothing downloaded), trained under an
# asymmetric plan from its safetensors on the bundled text, written back and loaded by transformers
example-hf: $(STAMP)
	$(BIN)/python examples/hf_tiny.py --folder .example-hf

# worksteal: a worker that runs out of tests takes queued ones from the other, so one long test
# at the end does not leave a core idle for minutes
# Then the tests marked `alone` by themselves: they measure rates or speeds (shaped links carrying
# their rate) that a second busy worker bends. Both parts always run; either failing fails.
# The `exhaustive` halves of the largest oracles are left to `make test-exhaustive` (about 1.5 min more).
test: $(STAMP)
	$(BIN)/python -m pytest -q --timeout=600 -n $(CORES_2_TO_4) --dist worksteal -m "not alone and not exhaustive"; \
	parallel=$$?; $(BIN)/python -m pytest -q --timeout=600 -m "alone and not exhaustive"; alone=$$?; \
	[ $$parallel -eq 0 ] && [ $$alone -eq 0 ]

# every test, the oracles' second halves included
test-exhaustive: $(STAMP)
	$(BIN)/python -m pytest -q --timeout=600 -n $(CORES_2_TO_4) --dist worksteal -m "not alone"; parallel=$$?; \
	$(BIN)/python -m pytest -q --timeout=600 -m alone; alone=$$?; \
	[ $$parallel -eq 0 ] && [ $$alone -eq 0 ]

# the suite without its slow multi-process runs and exhaustive oracles
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q --timeout=600 -n $(CORES_2_TO_4) --dist worksteal -m "not slow and not exhaustive"

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .demo .example-hf
