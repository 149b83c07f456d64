# The two commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

export SPARK_LOCAL_IP ?= 127.0.0.1

.PHONY: demo test docs bench check-java clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# One TensorFlow per environment: a .venv made with the former [cpu] extra holds tensorflow-cpu
# beside tensorflow (both write site-packages/tensorflow), so both go before the install.
$(STAMP): $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	@if $(PY) -m pip show --quiet tensorflow-cpu >/dev/null 2>&1; then \
	  echo "removing tensorflow-cpu and tensorflow from $(VENV) (two TensorFlows; tensorflow is installed again)"; \
	  $(PY) -m pip uninstall --quiet --yes tensorflow-cpu tensorflow; \
	fi
	$(PY) -m pip install --quiet -e ".[test,examples]"
	touch $(STAMP)

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "ERROR: 'java' was not found. Spark needs a JDK 17 or newer."; \
	  echo "  Debian/Ubuntu: sudo apt-get install -y openjdk-17-jdk-headless"; \
	  echo "  macOS:         brew install openjdk@17"; \
	  echo "  then make sure 'java -version' works (or set JAVA_HOME)."; \
	  exit 1; }
	@java -version >/dev/null 2>&1 || { echo "ERROR: 'java -version' failed; fix the JDK install (JDK 17+)."; exit 1; }

demo: check-java $(STAMP)
	$(PY) examples/train_digits.py

test: check-java $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests

docs: $(STAMP)
	$(PY) -m mkdocs build --strict
	@echo "open site/index.html"

bench: check-java $(STAMP)
	for b in benchmarks/bench_*.py; do $(PY) $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) build site *.egg-info
