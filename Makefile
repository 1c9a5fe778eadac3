# Two commands matter: `make test` and `make demo`. Both build .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
# spark-submit and the airflow CLI live in the venv; Spark's workers must use its python.
export PATH := $(BIN):$(PATH)
export PYSPARK_PYTHON := $(BIN)/python
export PYSPARK_DRIVER_PYTHON := $(BIN)/python

# Debian's PostgreSQL JDBC driver, for the Spark copy engine (spark.jars).
JDBC_JAR := /usr/share/java/postgresql.jar
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: venv lint test demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

venv: $(STAMP)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

$(JDBC_JAR):
	$(SUDO) apt-get update -qq
	$(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libpostgresql-jdbc-java

test: lint $(JDBC_JAR)
	$(BIN)/python -m pytest

demo: venv $(JDBC_JAR)
	$(BIN)/python -m airflow_provider_pglogical.demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
