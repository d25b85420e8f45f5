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
    """Options: ``inputs`` (JSON list of input specs), ``log`` (batch log path),
    ``storage_options`` (JSON)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return "offset STRING"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _Reader(dict(self.options))


class _Reader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver-side offsets, computed in Spark's Python streaming-source runner process.

    Gets everything through options (input specs, log path) instead of compiling the
    project again, so starting a query stays cheap.
    """

    def __init__(self, options: dict[str, str]) -> None:
        from octo_platform.runtime.offsets import InputSpec
        from octo_platform.wiring import default_environment

        self.specs = tuple(InputSpec(**s) for s in json.loads(options["inputs"]))
        self.log_path = options["log"]
        self.env = default_environment(json.loads(options.get("storage_options") or "{}"))
        self.target: dict[str, Any] | None = None

    def _log(self):
        from octo_platform.runtime.offsets import BatchLog

        return BatchLog(self.env.store, self.log_path)

    def initialOffset(self) -> dict:
        return {"batch": self._log().last_committed}

    def prepareForTriggerAvailableNow(self) -> None:
        from octo_platform.runtime.offsets import available

        self.target = available(self.specs, store=self.env.store, list_files=self.env.list_files)

    def latestOffset(self, start: dict, limit: Any) -> dict:
        from octo_platform.runtime.offsets import next_inputs

        nxt = next_inputs(self.specs, self._log(), store=self.env.store,
                          list_files=self.env.list_files, target=self.target)
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
