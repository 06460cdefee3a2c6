# Set-up and checks. `make demo` and `make test` work on a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo example-hf test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first: 2.13.0 is a CPU build on local disk; a plain requirement would pull CUDA.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/hexiscale validate instances/problems/demo-tiny.yaml instances/plans/demo-tiny.json
	# demo-asym: the best plan is asymmetric (three uneven stages: TP2 with 9 layers, then TP1 and TP1);
	# solve it, draw it, and train the solved plan (tiny model, same structure) on 4 local processes
	$(BIN)/hexiscale solve instances/problems/demo-asym.yaml --solver heuristic -o .demo-plan.json
	$(BIN)/hexiscale show instances/problems/demo-asym.yaml .demo-plan.json -o .demo-pictures
	$(BIN)/hexiscale run instances/problems/demo-asym.yaml .demo-plan.json --model tiny --steps 3

# a Hugging Face model made here (transformers + tokenizers, nothing downloaded), trained under an
# asymmetric plan from its safetensors on the bundled text, written back and loaded by transformers
example-hf: $(STAMP)
	$(BIN)/python examples/hf_tiny.py --folder .example-hf

test: $(STAMP)
	$(BIN)/python -m pytest -q --timeout=600

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) .demo-plan.json .example-hf
