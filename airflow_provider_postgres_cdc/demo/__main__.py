"""``python -m airflow_provider_postgres_cdc.demo`` runs the demo (see :mod:`.run`)."""

import sys

from airflow_provider_postgres_cdc.demo.run import main

sys.exit(main())
