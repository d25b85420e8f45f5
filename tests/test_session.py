"""The session octo builds (``runtime/session.py``)."""
from __future__ import annotations

from pathlib import Path

import pyspark


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


def test_delta_jars_leave_out_the_libraries_spark_ships(spark, tmp_path):
    """The jars noted from Delta's package, but those of artifacts in pyspark's own ``jars``
    (older Hadoop, Parquet, Jackson: parent-first, they were never loaded); the session's
    Delta reader works with what is left."""
    from octo_platform.runtime.session import _jar_list, _spark_ships, delta_jars

    env = {"XDG_CACHE_HOME": str(tmp_path)}
    fetched = {name: tmp_path / name for name in (
        "io.delta_delta-spark_4.2_2.13-4.4.0.jar", "commons-pool_commons-pool-1.6.jar",
        "org.apache.hadoop_hadoop-client-runtime-3.4.2.jar",
        "com.github.luben_zstd-jni-1.5.7-3.jar", "org.roaringbitmap_shims-0.9.25.jar")}
    for jar in fetched.values():
        jar.write_bytes(b"")
    listed = _jar_list(env)
    listed.parent.mkdir(parents=True)
    listed.write_text(",".join(f"file://{p}" for p in fetched.values()))
    assert {"commons-pool", "hadoop-client-runtime", "zstd-jni"} <= _spark_ships()
    kept = delta_jars(env)["spark.jars"].split(",")
    assert kept == [f"file://{fetched[n]}" for n in ("io.delta_delta-spark_4.2_2.13-4.4.0.jar",
                                                      "org.roaringbitmap_shims-0.9.25.jar")]
    fetched["org.roaringbitmap_shims-0.9.25.jar"].unlink()  # one is gone: fetched again
    assert "spark.jars.packages" in delta_jars(env)

    conf = spark.sparkContext.getConf()
    if not conf.get("spark.jars.packages", ""):  # not the session that fetched the package
        assert "delta-spark" in conf.get("spark.jars") \
            and "hadoop-client" not in conf.get("spark.jars")
    spark.range(3).write.format("delta").save(str(tmp_path / "t"))
    assert spark.read.format("delta").load(str(tmp_path / "t")).count() == 3


def test_a_session_for_s3_gets_s3a_from_the_same_variables_as_delta_rs(tmp_path):
    """A warehouse or a source in S3 adds S3A's package at pyspark's Hadoop version (with
    the AWS SDK's modules it uses) and its settings from the ``AWS_*`` variables; the credentials stay out of Spark's conf (its UI
    and event log show it)."""
    from octo_platform.runtime.session import delta_package, session_conf

    env = {"XDG_CACHE_HOME": str(tmp_path), "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
           "AWS_ACCESS_KEY_ID": "key-id", "AWS_SECRET_ACCESS_KEY": "the-secret"}
    local = session_conf(environ=env, uris=[str(tmp_path / "wh"), "kafka://h:1/t"])
    assert local["spark.jars.packages"] == delta_package()
    assert not any("s3" in k for k in local)
    conf = session_conf(environ=env, uris=[str(tmp_path / "wh"), "s3://bucket/data"])
    hadoop = [j for j in (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*")]
    version = hadoop[0].name.removeprefix("hadoop-client-api-").removesuffix(".jar")
    wanted = conf["spark.jars.packages"].split(",")
    assert wanted[:2] == [delta_package(), f"org.apache.hadoop:hadoop-aws:{version}"]
    # the AWS SDK's modules S3A uses, not its 686 MB bundle of every service
    assert {p.rsplit(":", 1)[0] for p in wanted[2:]} >= {"software.amazon.awssdk:s3"}
    assert conf["spark.jars.excludes"] == "software.amazon.awssdk:bundle"
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "us-east-1"
    assert not any(secret in v for v in conf.values() for secret in ("key-id", "the-secret"))
    # the caller's settings win over the store's
    mine = session_conf(environ=env, uris=["s3a://b/wh"],
                        conf={"spark.hadoop.fs.s3a.endpoint.region": "eu-west-1"})
    assert mine["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
