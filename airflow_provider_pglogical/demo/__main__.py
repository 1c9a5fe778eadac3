"""``python -m airflow_provider_pglogical.demo`` runs the demo (see :mod:`.run`)."""

import sys

from airflow_provider_pglogical.demo.run import main

sys.exit(main())
