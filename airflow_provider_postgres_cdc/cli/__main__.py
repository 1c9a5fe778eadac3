"""``python -m airflow_provider_postgres_cdc.cli``: the ``pgcdc`` command without its console script."""

import sys

from airflow_provider_postgres_cdc.cli import main

sys.exit(main())
