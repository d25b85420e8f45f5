"""The Dagster code location: every streaming table of a project's ``sql/`` as an asset.

``defs`` serves the repository's example project (the demo's pipelines) unless
``OCTO_PROJECT`` names another project directory. The environment is chosen here, once,
from environment variables (the only place that reads them):

- ``OCTO_PROJECT``       project directory (default: this repository)
- ``OCTO_WAREHOUSE``     warehouse directory or URI (default: ``<project>/warehouse``)
- ``OCTO_SPARK_MASTER``  Spark master (default: ``local[2]``)

Assets never read the environment; they get ``spark`` and ``warehouse`` resources.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import dagster as dg

from octo_platform.project import load_project
from orchestration.assets import project_assets
from orchestration.automation import project_automation
from orchestration.checks import project_checks
from orchestration.resources import SparkResource, WarehouseResource
from orchestration.translator import OctoTranslator

__all__ = ["build_definitions", "resources_from_env", "defs"]

REPO_ROOT = Path(__file__).resolve().parents[1]


def build_definitions(project_dir: str | Path, *, resources: Mapping[str, Any] | None = None,
                      translator: OctoTranslator | None = None) -> dg.Definitions:
    """Definitions of one octo project: source assets, one asset per streaming table and the
    ``spark`` / ``warehouse`` resources (default: local Spark, ``<project>/warehouse``).
    ``translator`` (default ``OctoTranslator()``) names and describes the assets; a subclass
    changes them for every asset, check, job, schedule and sensor.

    Runs execute in process: every step of a run shares one SparkSession (a JVM per step
    would cost seconds each), and steps run in dependency order.
    """
    project = load_project(project_dir)
    if resources is None:
        resources = {"spark": SparkResource(),
                     "warehouse": WarehouseResource(path=str(project.root / "warehouse"))}
    translator = translator or OctoTranslator()
    return dg.Definitions(assets=project_assets(project, translator),
                          asset_checks=project_checks(project, translator),
                          resources=dict(resources), executor=dg.in_process_executor,
                          **project_automation(project, translator))


def resources_from_env(project_dir: str | Path, environ: Mapping[str, str]) -> dict[str, Any]:
    """The resources of this environment, picked from ``OCTO_*`` variables."""
    master = environ.get("OCTO_SPARK_MASTER", "local[2]")
    warehouse = environ.get("OCTO_WAREHOUSE") or str(Path(project_dir).resolve() / "warehouse")
    # Catch-up runs last seconds to minutes: on a local master the JVM's quick start-up
    # settings save more CPU than its optimizing compiler would.
    return {"spark": SparkResource(master=master, quick_start=master.startswith("local"),
                                   reads=[warehouse]),
            "warehouse": WarehouseResource(path=warehouse)}


PROJECT_DIR = Path(os.environ.get("OCTO_PROJECT") or REPO_ROOT)
defs = build_definitions(PROJECT_DIR, resources=resources_from_env(PROJECT_DIR, os.environ))
