"""``make demo``: a shop database mirrored into a local Iceberg lake by the example DAGs."""
