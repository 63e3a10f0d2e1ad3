# mxnet-pfc: `make test` and `make run` set up everything they need on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
NP ?= 2
# The tests run on TEST_WORKERS pytest-xdist workers, a file (or the files sharing a session's run) each at a
# time (tests/conftest.py); TEST_WORKERS=0 runs them in this one process.
TEST_WORKERS ?= 3
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup
# mxnet 1.9 warns about numpy aliases on import; keep the logs readable.
export PYTHONWARNINGS ?= ignore::DeprecationWarning

.PHONY: setup doctor test test-fast lint catalogue run run-head bench bench-losses bench-train bench-finetune bench-data bench-memory bench-overlap bench-clean clean-venv

setup:                       ## create/refresh the virtual environment (idempotent)
	@bash setup-utils/install.sh

doctor: setup                ## what this machine will run: MXNet's build, the GPUs, Horovod, CPU or GPU (ARGS="--rec SET")
	$(PY) -m mxnet_pfc.doctor $(ARGS)

test: setup                  ## the lint, then the whole test suite (what .ci/run calls)
	$(VENV)/bin/ruff check .
	$(PYTEST) tests

test-fast: setup             ## the lint, then the unit and single-process tests (a test that launches ranks is skipped)
	$(VENV)/bin/ruff check .
	MXNET_PFC_FAST_TESTS=1 $(PYTEST) -q tests

lint: setup                  ## the lint alone (rules in pyproject.toml)
	$(VENV)/bin/ruff check .

catalogue:                   ## write tests/README.md from the test files' docstrings (tests/catalogue.py)
	python3 tests/catalogue.py

run: setup                   ## train the built-in default (synthetic set, $(NP) ranks on localhost, CPU)
	$(VENV)/bin/horovodrun --gloo -np $(NP) -H localhost:$(NP) bash config.sh -- $(ARGS)

run-head: setup              ## the head alone on synthetic embeddings, $(NP) ranks
	OMP_NUM_THREADS=1 $(VENV)/bin/horovodrun --gloo -np $(NP) -H localhost:$(NP) \
		$(PY) benchmarks/bench_head.py $(ARGS)

bench: setup                 ## the head figures of docs/benchmarks.md (100k and 1M classes, rates 1.0 and 0.1), then bench-losses
	bash benchmarks/run_head_benchmarks.sh
	bash benchmarks/run_loss_benchmarks.sh

bench-losses: setup          ## each margin loss's head step beside ArcFace's, same sizes (docs/benchmarks.md)
	bash benchmarks/run_loss_benchmarks.sh

bench-train: setup           ## the trainer's step beside its parts alone (backbone; head), $(NP) ranks, dummy data
	OMP_NUM_THREADS=1 MXNET_OMP_MAX_THREADS=1 $(VENV)/bin/horovodrun --gloo -np $(NP) -H localhost:$(NP) \
		$(PY) benchmarks/bench_train.py --json benchmarks/results/train.jsonl $(ARGS)

bench-memory: setup          ## peak host memory per rank over a whole run and its resume, phase by phase (10^6 classes x 512, 2 ranks; docs/benchmarks.md)
	$(PY) benchmarks/bench_memory.py --np $(NP) --json benchmarks/results/memory.jsonl $(ARGS)

bench-overlap: setup        ## the overlap search at 100k x 100k classes, D=512, on 1 then $(NP) ranks (about 40 min of one core), with the projection to 2M x 2M (docs/benchmarks.md)
	OMP_NUM_THREADS=1 $(PY) benchmarks/overlap_search.py --json benchmarks/results/overlap.jsonl $(ARGS)
	OMP_NUM_THREADS=1 MXNET_OMP_MAX_THREADS=1 $(VENV)/bin/horovodrun --gloo -np $(NP) -H localhost:$(NP) \
		$(PY) benchmarks/overlap_search.py --json benchmarks/results/overlap.jsonl $(ARGS)

bench-finetune: setup        ## fine-tuning a trained model on another synthetic set, and a 64-d student distilled from it (docs/benchmarks.md)
	NP=$(NP) bash benchmarks/fine_tune.sh $(ARGS)

bench-clean: setup           ## a noisy synthetic set cleaned by a sub-center run, then ArcFace on noisy, cleaned and clean sets (about 30 MB, 30-45 minutes; docs/benchmarks.md)
	OMP_NUM_THREADS=1 $(PY) benchmarks/clean_retrain.py $(ARGS)

bench-data: setup            ## a 1M-record set and a 200k-image folder, built once (about 6 GB, 5 minutes): start-up, shuffle, resume, decoding, data.check, data.pack (docs/benchmarks.md)
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_data.py $(ARGS)

clean-venv:
	rm -rf $(VENV)
