"""A Spark streaming source whose offsets are octo batches.

Each micro-batch of the Structured Streaming query carries one row: the JSON offset
``{"batch": N, "inputs": {...}}`` naming the files and upstream changelog versions of octo
batch N. The offsets come from the table's batch log in Delta (not from a Spark checkpoint),
so a lost checkpoint loses nothing; ``foreachBatch`` then does the actual work.

The reader is a *simple* stream reader: Spark's Python source runner (a process on the
driver) computes each offset and hands its row to the JVM with the plan, so a batch needs no
Python task on an executor and a query no read planner: fewer Python workers that can fail to
start on a busy machine, and ≈0.1 s less per trigger (an empty batch: 0.61 -> 0.52 s).
"""
from __future__ import annotations

import base64
import json
import pickle
from typing import TYPE_CHECKING, Any, Iterator

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

if TYPE_CHECKING:
    from octo_platform.runtime.environment import Environment

__all__ = ["OctoBatches", "FORMAT", "environment_option"]

FORMAT = "octo_batches"


def environment_option(env: Environment) -> str:
    """The ``environment`` option: how to build ``env`` again in the source runner (its
    ``rebuild``, pickled; Spark passes options to the reader as strings)."""
    from pyspark import cloudpickle

    return base64.b64encode(cloudpickle.dumps(env.rebuild)).decode("ascii")


class OctoBatches(DataSource):
    """Options: ``inputs`` (JSON list of input specs), ``log`` (batch log path),
    ``environment`` (see ``environment_option``)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return "offset STRING"

    def simpleStreamReader(self, schema: Any) -> SimpleDataSourceStreamReader:
        return _Reader(dict(self.options))


class _Reader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """Driver-side offsets, computed in Spark's Python streaming-source runner process.

    Gets everything through options (input specs, log path) instead of compiling the
    project again, so starting a query stays cheap.
    """

    def __init__(self, options: dict[str, str]) -> None:
        from octo_platform.runtime.offsets import InputSpec

        self.specs = tuple(InputSpec.from_json(s) for s in json.loads(options["inputs"]))
        self.log_path = options["log"]
        self.environment = options.get("environment")
        self._env: Environment | None = None
        self.target: dict[str, Any] | None = None

    @property
    def env(self) -> Environment:
        """The storage environment, built on first use: Spark starts a second source runner
        per query that only builds the reader, and delta-rs' import is not free."""
        if self._env is None:
            rebuild = pickle.loads(base64.b64decode(self.environment))
            self._env = rebuild()
        return self._env

    def _log(self):
        from octo_platform.runtime.offsets import BatchLog

        return BatchLog(self.env.store, self.log_path)

    def initialOffset(self) -> dict:
        return {"batch": self._log().last_committed}

    def prepareForTriggerAvailableNow(self) -> None:
        from octo_platform.runtime.offsets import available

        self.target = available(self.specs, env=self.env)

    def read(self, start: dict) -> tuple[Iterator[tuple[str]], dict]:
        """The next batch after ``start`` as one row, and its offset (``start`` if none)."""
        from octo_platform.runtime.offsets import next_inputs

        nxt = next_inputs(self.specs, self._log(), env=self.env, target=self.target)
        if nxt is None or nxt[0] <= int(start["batch"]):
            return iter(()), start
        end = {"batch": nxt[0], "inputs": nxt[1]}
        return iter([(json.dumps(end, sort_keys=True),)]), end

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple[str]]:
        """A batch Spark planned before a restart of the query: its row again."""
        if int(end["batch"]) <= int(start["batch"]):
            return iter(())
        return iter([(json.dumps(end, sort_keys=True),)])

    def commit(self, end: dict) -> None:
        """Nothing to do: the batch log in Delta is the source of truth."""
