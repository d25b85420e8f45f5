"""The session octo builds (``runtime/session.py``)."""
from __future__ import annotations


def test_the_jvm_view_asks_for_a_class_and_its_methods_once(spark, monkeypatch):
    client = type(spark.sparkContext._gateway._gateway_client)
    send, asked = client.send_command, []

    def counting(self, command, *args, **kwargs):
        asked.append(command.split("\n", 1)[0])
        return send(self, command, *args, **kwargs)

    monkeypatch.setattr(client, "send_command", counting)
    jvm = spark.sparkContext._jvm
    for n in range(3):
        assert jvm.PythonUtils.toSeq([n, 2]).apply(0) == n
        assert jvm.PythonUtils.toList([n, 2, 3]).length() == 3
    # PythonUtils, then its toSeq and toList: three look-ups for three rounds
    assert asked.count("r") == 3, asked
    assert jvm.PythonUtils is jvm.PythonUtils
