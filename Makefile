# Two commands matter: `make test` and `make demo`. Both build .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
# spark-submit and the airflow CLI live in the venv; Spark's workers must use its python.
export PATH := $(BIN):$(PATH)
export PYSPARK_PYTHON := $(BIN)/python
export PYSPARK_DRIVER_PYTHON := $(BIN)/python

# The official Apache artifacts the Spark jobs load for the lake (Iceberg's Spark runtime and AWS
# bundle, hadoop-aws and its AWS SDK, the PostgreSQL and SQLite JDBC drivers), pinned with their
# checksums in tools/lake-jars/ and copied from Maven's cache into the virtualenv once.
SPARK_LINE ?= 3.5
LAKE_JARS_DIR := $(CURDIR)/$(VENV)/lake-jars/spark-$(SPARK_LINE)
# What local Spark loads for the lake (airflow_provider_postgres_cdc.spark.local_jars reads it).
export POSTGRES_CDC_SPARK_JARS := $(shell tools/lake-jars/jars.sh list $(SPARK_LINE) $(LAKE_JARS_DIR))
# The class-data archive of Spark's classes the tests' short drivers map instead of loading them
# (airflow_provider_postgres_cdc/testing/spark_cds.py; written once, about 40 s).
export POSTGRES_CDC_SPARK_CDS := $(CURDIR)/$(VENV)/spark-cds/spark-$(SPARK_LINE).jsa
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: venv lake-jars spark-cds spark4 spark4-background browser pg15 lint test-setup test test-floor test-fast test-cluster test-long soak e2e-on-lag demo clean

# The newest Airflow the whole suite runs on, and the oldest the package declares (pyproject's
# floor), on which the Airflow faces' unit tests run too.
AIRFLOW_NEWEST := 3.3.2
AIRFLOW_FLOOR := 3.3.0

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]' 'apache-airflow==$(AIRFLOW_NEWEST)'
	touch $@

venv: $(STAMP)

FLOOR_VENV := .venv-airflow-floor
FLOOR_STAMP := $(FLOOR_VENV)/.installed
$(FLOOR_STAMP): pyproject.toml
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(FLOOR_VENV)/bin/python -m pip install --quiet -e '.[test]' 'apache-airflow==$(AIRFLOW_FLOOR)'
	touch $@

# The unit tests of the Airflow faces (hooks, operators, sensors, triggers, plugins, lineage, the DAG
# factories and task groups, metrics, the example DAGs) on the Airflow floor; the decoder, engine and
# formats below them import no Airflow. About 40 s: the install is mostly the pip cache.
AIRFLOW_FACE_TESTS := $(addprefix tests/unit/,hooks lineage operators plugins sensors triggers \
	test_dag_factories.py test_dag_parsing.py test_demo.py test_layers.py test_metrics.py test_task_groups.py)
test-floor: $(FLOOR_STAMP)
	$(FLOOR_VENV)/bin/python -m pytest $(AIRFLOW_FACE_TESTS) -q -n $(WORKERS) -p no:cacheprovider

# Debian's packages the targets need, in one apt-get (two at once would fight over dpkg's lock):
# Maven, which resolves the lake's jars; chromium, the real browser the Airflow view's test loads
# the page in (tests/integration/airflow); PostgreSQL 15, the oldest server the suite runs on (the
# test kit's wheel brings 18).
MVN := /usr/bin/mvn
CHROMIUM := /usr/bin/chromium
PG15 := /usr/lib/postgresql/15/bin/postgres
$(MVN) $(CHROMIUM) $(PG15) &:
	$(SUDO) apt-get update -qq
	$(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven chromium postgresql-15

$(CURDIR)/$(VENV)/lake-jars/spark-%/.fetched: $(MVN) tools/lake-jars/pom.xml tools/lake-jars/SHA256SUMS tools/lake-jars/jars.sh
	tools/lake-jars/jars.sh fetch $* $(@D)
	touch $@

lake-jars: $(LAKE_JARS_DIR)/.fetched

$(POSTGRES_CDC_SPARK_CDS): $(LAKE_JARS_DIR)/.fetched | $(STAMP)
	$(BIN)/python -m airflow_provider_postgres_cdc.testing.spark_cds $@

spark-cds: $(POSTGRES_CDC_SPARK_CDS)

# Spark 4.1 with Iceberg 1.12, the second line the jobs are tested on (docs/LAKE.md, "Versions").
# pyspark 4 installs into the same `pyspark/` folder as 3.5, so it gets a virtualenv of its own, with
# the 4.1 lake jars: pyspark with its `connect` extra, a Spark distribution as on a worker (the jobs
# import nothing else) whose Python is also a Spark Connect client (grpcio, pandas, pyarrow;
# testing/spark_connect.py runs the server). The 4.1 job tests put its site-packages ahead of the test
# virtualenv's, so every package both hold is pinned to the test virtualenv's version (its list, less
# pyspark, as constraints). `make test` starts the install in the background (about 50 s from a cold
# pip cache: the sdist is built into a wheel) so that it overlaps lint and the unit tests; the 4.1
# tests wait for it (tests/spark_lines.py).
PYSPARK4 := 4.1.1
SPARK4_VENV := .venv-spark4
SPARK4_STAMP := $(SPARK4_VENV)/.pyspark-connect-$(PYSPARK4)
SPARK4_INSTALL := rm -rf $(SPARK4_VENV) && $(PYTHON) -m venv --without-pip $(SPARK4_VENV) \
	&& $(BIN)/python -m pip list --format=freeze --exclude-editable | grep -iv '^pyspark==' \
		> $(SPARK4_VENV)/constraints.txt \
	&& $(BIN)/python -m pip --python $(SPARK4_VENV)/bin/python install --quiet \
		--constraint $(SPARK4_VENV)/constraints.txt 'pyspark[connect]==$(PYSPARK4)' \
	&& touch $(SPARK4_STAMP)
$(SPARK4_STAMP): | $(STAMP)
	$(SPARK4_INSTALL)

spark4: $(SPARK4_STAMP) $(CURDIR)/$(VENV)/lake-jars/spark-4.1/.fetched

# The install in the background: its log in .venv-spark4.log, its process id in .venv-spark4.pid.
spark4-background: $(CURDIR)/$(VENV)/lake-jars/spark-4.1/.fetched | $(STAMP)
	@if [ ! -f $(SPARK4_STAMP) ] && ! grep -qs $(SPARK4_VENV) "/proc/$$(cat $(SPARK4_VENV).pid 2>/dev/null)/cmdline"; then \
		echo "installing pyspark[connect] $(PYSPARK4) into $(SPARK4_VENV) in the background (log: $(SPARK4_VENV).log)"; \
		(set -x; $(SPARK4_INSTALL)) > $(SPARK4_VENV).log 2>&1 & echo $$! > $(SPARK4_VENV).pid; \
	fi

browser: $(CHROMIUM)
pg15: $(PG15)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The cluster tests (marker `cluster`: minutes of JVM start-ups each) run in `make test-cluster`.
# WORKERS pytest-xdist processes share the suite by whole modules (module fixtures stay shared), in
# the order tests/conftest.py gives: the longest modules first. Each worker starts its own
# PostgreSQL clusters and Spark session. Two on two cores: most of a test's time is spent waiting
# (on JVM and Airflow start-ups, a scheduler's loop, a server), not computing.
WORKERS ?= 2
# What the suite needs first, made in parallel (downloads, installs and lint overlap; each target's
# output is printed whole when it ends).
test-setup: spark4-background lint test-floor lake-jars spark-cds $(CHROMIUM) $(PG15)

test:
	$(MAKE) --no-print-directory -j4 --output-sync=target test-setup
	$(BIN)/python -m pytest -m "not cluster and not long" -n $(WORKERS) --dist loadfile --no-loadscope-reorder

# The long runs (marker `long`: backfills behind the CDC through a real scheduler, the test kit's own
# scheduler runs, and more of the Spark jobs' tests on Spark 4.1), whose steps `make test` covers one
# by one (about 7 min).
test-long: test-setup
	$(BIN)/python -m pytest -m long -n $(WORKERS) --dist loadfile --no-loadscope-reorder

# The pipeline on a Spark standalone cluster (two one-core workers, started by the tests): the
# end-to-end CDC run under writes with executors and the driver killed mid-apply (about 4 min).
test-cluster: lake-jars spark-cds
	$(BIN)/python -m pytest -m cluster tests/integration/cluster -q

# The edit-test loop, under 2 minutes and no server: lint, types and tests/unit only (the same tests
# as `-m "not integration"`, tests/unit/test_markers.py checks it). CI runs `make test`.
test-fast: lint
	$(BIN)/python -m pytest tests/unit

# The crash soak over many seeds (no lint): `make soak SEEDS=100` runs seeds 1-100 (also A-B or A,B),
# ROUNDS crash rounds each; one line per seed, a summary line, and a failing seed's replay command.
SEEDS ?= 20
ROUNDS ?= 3
soak: lake-jars spark-cds
	POSTGRES_CDC_SOAK_SEEDS=$(SEEDS) POSTGRES_CDC_SOAK_ROUNDS=$(ROUNDS) $(BIN)/python -m pytest \
		tests/integration/reliability/test_crash_soak.py -q

# The example DAG postgres_cdc_on_lag started by its AssetWatcher, end to end (about 100 s; not in
# `make test`, whose tests/integration/airflow/test_asset_watcher.py covers the watcher itself).
e2e-on-lag: lake-jars spark-cds
	POSTGRES_CDC_ON_LAG_E2E=1 $(BIN)/python -m pytest tests/integration/e2e/test_cdc_on_lag.py -q

# The snapshot by spark-submit (Spark 3.5), the CDC rounds on a warm Spark Connect server (Spark 4.1
# with Iceberg 1.12, from .venv-spark4), each round's seconds printed.
demo: venv lake-jars spark4
	$(BIN)/python -m airflow_provider_postgres_cdc.demo --connect-python $(CURDIR)/$(SPARK4_VENV)/bin/python \
		--connect-jars $(shell tools/lake-jars/jars.sh list 4.1 $(CURDIR)/$(VENV)/lake-jars/spark-4.1)

clean:
	rm -rf $(VENV) $(FLOOR_VENV) $(SPARK4_VENV) $(SPARK4_VENV).log $(SPARK4_VENV).pid .pytest_cache .mypy_cache .ruff_cache
