PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# mkdocs-material prints a notice about MkDocs 2.0 on every build; the site builds with MkDocs 1.x.
export NO_MKDOCS_2_WARNING := 1

.PHONY: demo test lint docs gl bench bench-jax bench-offline peers peers-brax clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev,sweep,export,docs]"
	touch $(STAMP)

## Train SAC on Pendulum-v1 (0.5-4 min on 2 CPU cores, depending on the machine): logs, checkpoint
## and plot in runs/demo, then a video of the trained policy (skipped, with a note, where it cannot render).
demo: $(STAMP)
	$(BIN)/jaxrl train sac --env Pendulum-v1 --total-steps 12000 --out runs/demo \
	  --eval-every 2000 --eval-episodes 10 --learning-starts 1000 --seed 0
	@err=$$($(BIN)/jaxrl eval runs/demo --episodes 1 --video runs/demo/videos/final.mp4 2>&1 >/dev/null) \
	  && echo "video of the trained policy: runs/demo/videos/final.mp4" \
	  || echo "no video (rendering is not possible here): $$(echo "$$err" | tail -n 1)"

## The system libraries MuJoCo renders videos with, headless (EGL, OSMesa); Debian/Ubuntu, as root.
gl:
	apt-get install -y --no-install-recommends libegl1 libgl1 libosmesa6

## Check the layer contract and the docs, then run the test suite (learning tests included;
## 25-50 min on 2 idle cores depending on the CPU, two xdist workers). The learning tests' shared
## Pendulum data are generated in the background meanwhile (tests/offline_utils.py; the tests
## wait for them under a file lock, or make them if that process failed).
test: $(STAMP)
	$(BIN)/python tests/offline_utils.py > /dev/null 2>&1 &
	$(BIN)/lint-imports
	@# Not -q: it hides warnings, and then --strict lets them pass.
	$(BIN)/mkdocs build --strict > $(VENV)/mkdocs.log 2>&1 || (grep -v "^INFO" $(VENV)/mkdocs.log; exit 1)
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=15 tests

lint: $(STAMP)
	$(BIN)/ruff check .

## Build the documentation site (user guide, benchmark results, API reference) into site/.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

## Peer libraries for side-by-side benchmarks live in their own virtualenv.
peers:
	bash benchmarks/peers/setup_peers.sh

bench: $(STAMP) peers
	$(BIN)/python benchmarks/throughput.py

## brax.training 0.14.2 needs jax 0.7.x: it gets its own virtualenv (.venv-brax).
peers-brax:
	bash benchmarks/peers/setup_brax.sh

## Fused loop on Brax envs vs brax.training, and 8 vmapped seeds vs 1 (~30 min on 2 cores).
bench-jax: $(STAMP) peers-brax
	$(BIN)/python benchmarks/jax_envs.py

## Offline agents (BC, TD3+BC, CQL, IQL, ReBRAC) vs d3rlpy, updates/s on one dataset (~5 min).
bench-offline: $(STAMP) peers
	$(BIN)/python benchmarks/offline.py

clean:
	rm -rf $(VENV) runs
