"""octo's task functions in pyspark's Python workers: the worker's imports are frozen
(``workers.task_started``), so the collection pyspark's daemon runs after every task of a
reused worker has next to nothing to look at; the driver is left alone."""
from __future__ import annotations

import gc

from octo_platform.workers import task_started


def test_a_task_freezes_its_workers_imports_and_the_driver_is_left_alone(spark):
    before = gc.get_freeze_count()
    task_started()  # in the driver: no task runs here
    assert gc.get_freeze_count() == before

    def probe(batches):  # a mapInArrow function, started as octo's task functions are
        import gc
        import sys

        import pyarrow as pa

        from octo_platform.workers import task_started

        task_started()
        for _ in batches:
            yield pa.RecordBatch.from_pydict({"frozen": [gc.get_freeze_count()],
                                              "tracked": [len(gc.get_objects())],
                                              "pandas": ["pandas" in sys.modules]})

    rows = spark.range(0, 2, numPartitions=2).mapInArrow(
        probe, "frozen BIGINT, tracked BIGINT, pandas BOOLEAN").collect()
    assert len(rows) == 2
    for r in rows:
        # pyarrow, numpy, pandas, pyspark and octo frozen (tens of thousands of objects);
        # what the collector still tracks is what the tasks made since
        assert r.frozen > 20_000 and r.tracked < r.frozen // 10, r
        assert r.pandas, r  # imported before the freeze (pyspark's serializers import it)
