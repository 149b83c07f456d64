# The two commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

export SPARK_LOCAL_IP ?= 127.0.0.1

.PHONY: demo test test-spark35 docs bench check-java clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# One TensorFlow per environment: a .venv made with the former [cpu] extra holds tensorflow-cpu
# beside tensorflow (both write site-packages/tensorflow), so both go before the install.
# The demo needs sparktf and what it requires, nothing more; the suite adds the test extra.
# An editable install of a folder named like its package makes setuptools warn that such a folder in the
# working directory may shadow the package: here it IS the package (its source), so the warning is hidden.
EDITABLE := PYTHONWARNINGS="ignore:Editable installation"
$(STAMP): $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	@if $(PY) -m pip show --quiet tensorflow-cpu >/dev/null 2>&1; then \
	  echo "removing tensorflow-cpu and tensorflow from $(VENV) (two TensorFlows; tensorflow is installed again)"; \
	  $(PY) -m pip uninstall --quiet --yes tensorflow-cpu tensorflow; \
	fi
	$(EDITABLE) $(PY) -m pip install --quiet -e .
	touch $(STAMP)

# The suite's JVMs share an archive of Spark's classes (tests/jvm_class_archive.py): it is dumped here, with
# the install, rather than by the first test run (~20 s of one Spark session before any test starts).
$(TEST_STAMP): $(STAMP)
	$(EDITABLE) $(PY) -m pip install --quiet -e ".[test]"
	$(PY) tests/jvm_class_archive.py >/dev/null
	touch $(TEST_STAMP)

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

test: check-java $(TEST_STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15 tests

# The oldest supported Spark (3.5), in an environment of its own: training, evaluate, both predict
# paths, the ML stage, sparktf.run and a SparseVector column (.ci/run runs it after `make test`).
SPARK35_VENV  := .venv-spark35
SPARK35_TESTS := tests/test_readme.py \
  tests/test_ml_pipeline.py::test_pipeline_fits_scores_evaluates_and_round_trips \
  tests/test_launch_run.py::test_chief_result_ctx_and_both_roles_logs_reach_the_driver \
  tests/test_predictor.py::test_a_resource_profile_on_a_dataframe_stage_is_passed_under_spark4_and_refused_naming_it_under_35 \
  tests/test_dataset_dataframe.py::test_a_wide_sparse_vector_column_stays_sparse_and_trains_evaluates_and_predicts_as_dense_keras

test-spark35: check-java
	test -x $(SPARK35_VENV)/bin/python || $(PYTHON) -m venv $(SPARK35_VENV)
	$(SPARK35_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(EDITABLE) $(SPARK35_VENV)/bin/python -m pip install --quiet -e . "pyspark>=3.5,<3.6" "pytest>=7" "pytest-timeout>=2"
	$(SPARK35_VENV)/bin/python -m pytest -q -p no:cacheprovider $(SPARK35_TESTS)

docs: $(TEST_STAMP)
	$(PY) -m mkdocs build --strict
	@echo "open site/index.html"

bench: check-java $(TEST_STAMP)
	for b in benchmarks/bench_*.py; do $(PY) $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) $(SPARK35_VENV) build site *.egg-info
