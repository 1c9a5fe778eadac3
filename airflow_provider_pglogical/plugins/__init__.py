"""Airflow plugins of the provider: the "pglogical" view of the Airflow UI (:mod:`.report_view`)."""
