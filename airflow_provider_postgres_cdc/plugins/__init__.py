"""Airflow plugins of the provider: the "Postgres CDC" view of the Airflow UI (:mod:`.report_view`)."""
