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

    def calls(n: int) -> None:
        assert jvm.PythonUtils.toSeq([n, 2]).apply(0) == n
        assert jvm.PythonUtils.toList([n, 2, 3]).length() == 3

    calls(0)  # PythonUtils, its toSeq and toList: at most three look-ups (fewer if known)
    assert asked.count("r") <= 3, asked
    asked.clear()
    calls(1)
    calls(2)
    assert "r" not in asked, asked  # calls (and lists made), no look-up
    assert jvm.PythonUtils is jvm.PythonUtils
