"""``python -m airflow_provider_pglogical.cli``: the ``pglogical`` command without its console script."""

import sys

from airflow_provider_pglogical.cli import main

sys.exit(main())
