"""Format rules shared by the engine and the Spark job: standard library only, shipped to the job.

LSNs, manifests and staged names, the lake's vocabulary, PostgreSQL type names and the schema-change
rules. The apply job receives this whole package through ``--py-files`` (``spark.job_py_files``), so
each rule has one definition on both sides of spark-submit.
"""
