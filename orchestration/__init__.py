"""Dagster code location for octo projects.

``definitions.build_definitions(project_dir)`` turns a project's ``sql/`` folder into assets
(``assets.py``: one per streaming table, external ones for sources, lineage and schema from
the compiled plans; keys, groups, descriptions, metadata and partitions from
``translator.OctoTranslator``, which a user may subclass) bound to typed, lazy resources
(``resources.py``); materializing an asset is one catch-up run of
``octo_platform.runtime.runner.run_tables``. ``runs.py`` turns what a run did and where a
table stands into metadata, for catch-up runs, continuous runs and lag observations alike.
"""
