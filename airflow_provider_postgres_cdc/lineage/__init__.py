"""OpenLineage for the pipeline's tasks (README "OpenLineage"): the openlineage provider's operator protocol.

The operators' ``get_openlineage_facets_on_start`` / ``get_openlineage_facets_on_complete`` delegate
here (:mod:`.tasks` lists what each task reports); :mod:`.datasets` builds the datasets and their
facets, :mod:`.naming` names the lake tables as OpenLineage's Spark integration does (by location,
with the catalog's names as symlinks), :mod:`.facets` defines the provider's two custom facets.
The openlineage provider is the optional ``openlineage`` extra: every OpenLineage import happens
inside a function, so the package imports and runs without it, and the entry points then return None.
"""
