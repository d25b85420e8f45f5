"""What octo's Spark task functions (``applyInArrow`` / ``mapInArrow``) do first in
pyspark's Python workers."""
from __future__ import annotations

import gc
import importlib

__all__ = ["task_started"]

# What a task imports as it runs, imported before the freeze: pyspark's Arrow serializers
# import pandas after a task's function returns (31K objects more for every collection).
_LATER = ("pandas", "pyarrow.acero", "pyarrow.parquet")
_frozen = [False]


def task_started() -> None:
    """Once per Python worker process, at the start of one of octo's task functions: the
    objects alive then (the modules, classes and functions the worker imported: pyarrow,
    numpy, pandas, pyspark, octo) are moved out of the garbage collector's reach
    (``gc.freeze``). pyspark's daemon runs a full collection after every task of a reused
    worker: over those imports it took ~20 ms a task, three quarters of the workers' CPU in
    a Spark-path oracle test (py-spy); frozen, microseconds. Nothing in the driver (no task
    runs there), whose runs freeze their own (``pipeline.collecting_new_objects``)."""
    if _frozen[0]:
        return
    from pyspark import TaskContext

    if TaskContext.get() is not None:
        _frozen[0] = True
        for module in _LATER:
            importlib.import_module(module)
        gc.freeze()
