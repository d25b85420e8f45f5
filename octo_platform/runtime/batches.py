"""A Spark streaming source whose offsets are octo batches.

Each micro-batch of the Structured Streaming query carries one row: the JSON offset
``{"batch": N, "inputs": {...}}`` naming the files and upstream changelog versions of octo
batch N. The offsets come from the table's batch log in Delta (not from a Spark checkpoint),
so a lost checkpoint loses nothing; ``foreachBatch`` then does the actual work.
"""
from __future__ import annotations

import json
from typing import Any, Iterator

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

__all__ = ["OctoBatches", "FORMAT"]

FORMAT = "octo_batches"


class OctoBatches(DataSource):
    """Options: ``project``, ``warehouse``, ``table``, ``storage_options`` (JSON)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return "offset STRING"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _Reader(dict(self.options))


class _Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Runs in Spark's Python worker on the driver side; loads the project once."""

    def __init__(self, options: dict[str, str]) -> None:
        from octo_platform.project import load_project
        from octo_platform.runtime.pipeline import Layout
        from octo_platform.wiring import default_environment

        self.project = load_project(options["project"])
        self.table = self.project.table(options["table"])
        self.layout = Layout(options["warehouse"])
        self.env = default_environment(json.loads(options.get("storage_options") or "{}"))
        self.target: dict[str, Any] | None = None

    def initialOffset(self) -> dict:
        from octo_platform.runtime.pipeline import BatchLog

        log = BatchLog(self.env.store, self.layout.log(self.table.name))
        return {"batch": log.last_committed}

    def prepareForTriggerAvailableNow(self) -> None:
        from octo_platform.runtime.pipeline import available

        self.target = available(self.project, self.table, self.layout, self.env)

    def latestOffset(self, start: dict, limit: Any) -> dict:
        from octo_platform.runtime.pipeline import next_inputs

        nxt = next_inputs(self.project, self.table, self.layout, self.env, target=self.target)
        if nxt is None or nxt[0] <= int(start["batch"]):
            return start
        return {"batch": nxt[0], "inputs": nxt[1]}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if int(end["batch"]) <= int(start["batch"]):
            return []
        return [InputPartition(json.dumps(end, sort_keys=True))]

    def read(self, partition: InputPartition) -> Iterator[tuple[str]]:
        yield (partition.value,)

    def commit(self, end: dict) -> None:
        """Nothing to do: the batch log in Delta is the source of truth."""
