"""OpenLineage for the pipeline's tasks (README "OpenLineage"): the openlineage provider's operator protocol.

The operators' ``get_openlineage_facets_on_start`` / ``get_openlineage_facets_on_complete`` delegate
here (:mod:`.tasks` lists what each task reports); :mod:`.datasets` names the datasets and builds
their facets, :mod:`.facets` defines the provider's two custom facets. The openlineage provider is
the optional ``openlineage`` extra: every OpenLineage import happens inside a function, so the
package imports and runs without it, and the entry points then return None.
"""
