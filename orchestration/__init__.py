"""Dagster code location for octo projects (assets, resources, schedules, sensors, checks).

Planned in the orchestration issue; the runtime it will call is
``octo_platform.runtime.runner.run_tables`` (catch-up runs with ``until_idle=True``,
continuous runs with a ``deadline``).
"""
