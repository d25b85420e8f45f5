"""Dagster code location for octo projects.

``definitions.build_definitions(project_dir)`` turns a project's ``sql/`` folder into assets
(``assets.py``: one per streaming table, external ones for sources, lineage and schema from
the compiled plans) bound to typed, lazy resources (``resources.py``); materializing an asset
is one catch-up run of ``octo_platform.runtime.runner.run_tables``.
"""
