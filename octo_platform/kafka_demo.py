"""``octo demo --kafka``: Debezium change events in from a Kafka topic, a streaming table's
changelog out to another, on a local broker (tansu, ``connectors/tansu.py``).

Each round publishes generated account changes (creates, balance updates, deletes) to
``dbserver.public.accounts``, runs the project until idle, and prints the table and the
newest messages of the sink topic ``accounts_by_region``.
"""
from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from octo_platform.demo import _grid
from octo_platform.errors import OctoError

__all__ = ["run_kafka_demo"]

SQL = """\
-- Accounts from a Debezium topic, per region, published as a Debezium topic again.
CREATE SOURCE accounts (id BIGINT, owner STRING, region STRING, balance BIGINT)
WITH (connector = 'kafka', bootstrap_servers = '{address}',
      topic = 'dbserver.public.accounts', format = 'debezium-json', primary_key = 'id');

CREATE STREAMING TABLE accounts_by_region AS
SELECT region, COUNT(*) AS accounts, SUM(balance) AS balance
FROM accounts GROUP BY region;

CREATE SINK accounts_by_region_out FROM accounts_by_region
WITH (connector = 'kafka', bootstrap_servers = '{address}', topic = 'accounts_by_region',
      format = 'debezium-json', tombstones = 'true');
"""
REGIONS = ("eu", "us", "apac", "latam")
SHOWN_MESSAGES = 6
PARTITIONS = 3  # of both topics


def run_kafka_demo(*, directory: str | None = None, rounds: int = 3) -> None:
    from confluent_kafka import Producer

    from connectors.tansu import create_topic, local_broker
    from octo_platform.project import load_project
    from octo_platform.runtime.runner import run_tables
    from octo_platform.runtime.class_archive import driver_defaults
    from octo_platform.runtime.session import spark_session
    from octo_platform.wiring import default_options

    if rounds < 1:
        raise OctoError(f"--rounds must be at least 1 (got {rounds})")
    root = Path(directory).resolve() if directory else Path(tempfile.mkdtemp(prefix="octo-kafka-"))
    if root.exists() and any(root.iterdir()):
        raise OctoError(f"demo directory {root} exists and is not empty: pick a new one")
    started = time.monotonic()
    print("starting a local Kafka broker (tansu) ...", flush=True)
    with local_broker() as address:
        create_topic(address, "dbserver.public.accounts", PARTITIONS)
        create_topic(address, "accounts_by_region", PARTITIONS)
        (root / "sql").mkdir(parents=True)
        (root / "sql" / "accounts.sql").write_text(SQL.format(address=address))
        project = load_project(root)
        options = default_options(progress=None)
        print(f"demo project: {root}\nbroker: {address}\nstarting Spark ...", flush=True)
        spark = spark_session(defaults=driver_defaults({}, quick=True))
        # One message per request: the broker's high watermark then covers every message.
        producer = Producer({"bootstrap.servers": address, "linger.ms": 0,
                             "batch.num.messages": 1})
        accounts: dict[int, dict[str, Any]] = {}
        rng = random.Random(2026)
        for round_no in range(rounds):
            events = _changes(rng, accounts, 60 if round_no == 0 else 25)
            for event in events:
                row = event["payload"]["after"] or event["payload"]["before"]
                producer.produce("dbserver.public.accounts", json.dumps(event),
                                 key=json.dumps({"id": row["id"]}))
            producer.flush(30)
            ops = " ".join(f"{op}={sum(e['payload']['op'] == op for e in events)}"
                           for op in "cud")
            print(f"\n{'=' * 90}\nRound {round_no + 1}/{rounds}: {len(events)} change events "
                  f"({ops}) published to dbserver.public.accounts\n{'=' * 90}", flush=True)
            report = run_tables(spark, project, options=options, until_idle=True)
            for b in report.batches:
                print(b.line())
            for s in report.published:
                print(s.line())
            table = options.env.store.read(options.layout(root).current("accounts_by_region"))
            if table is not None:
                rows = sorted(tuple(r[c] for c in ("region", "accounts", "balance"))
                              for r in table.to_pylist())
                print("\naccounts_by_region:\n" + _grid(["region", "accounts", "balance"],
                                                        rows))
            print("\nnewest messages of topic accounts_by_region (key -> value):")
            for key, value in _newest(address, "accounts_by_region", PARTITIONS,
                                      SHOWN_MESSAGES):
                print(f"  {key} -> {value}")
    print(f"\ndone in {time.monotonic() - started:.0f}s (the broker kept its topics in memory "
          "and is gone; the warehouse stays)\n"
          f"  octo explain accounts_by_region --project {root}")


def _changes(rng: random.Random, accounts: dict[int, dict[str, Any]], n: int
             ) -> list[dict[str, Any]]:
    """``n`` Debezium change events (Kafka Connect envelopes) over ``accounts``, applied."""
    out = []
    for _ in range(n):
        op = rng.choice("cuud") if len(accounts) > 10 else "c"
        if op == "c":
            new_id = max(accounts, default=0) + 1
            row = {"id": new_id, "owner": f"owner{new_id}", "region": rng.choice(REGIONS),
                   "balance": rng.randint(0, 1000)}
            accounts[new_id] = row
            event = {"before": None, "after": row, "op": "c"}
        else:
            old = accounts[rng.choice(sorted(accounts))]
            if op == "u":
                new = {**old, "balance": old["balance"] + rng.randint(-100, 100)}
                if rng.random() < 0.2:
                    new["region"] = rng.choice(REGIONS)
                accounts[old["id"]] = new
                event = {"before": old, "after": new, "op": "u"}
            else:
                del accounts[old["id"]]
                event = {"before": old, "after": None, "op": "d"}
        out.append({"schema": None, "payload": {**event, "ts_ms": int(time.time() * 1000)}})
    return out


def _newest(address: str, topic: str, partitions: int, n: int
            ) -> list[tuple[str | None, str | None]]:
    """The last ``n`` messages of ``topic`` (by timestamp, over its partitions)."""
    from connectors.kafka import to_end

    config = {"bootstrap.servers": address, "group.id": "octo-demo",
              "enable.auto.commit": False, "enable.partition.eof": True,
              "fetch.wait.max.ms": 10}
    found = [(msg.timestamp()[1], _text(msg.key()), _text(msg.value()))
             for p in range(partitions)
             for msg in to_end(config, topic, p, 0, f"topic {topic!r}", wait_s=10)]
    return [(k, v) for _, k, v in sorted(found, key=lambda f: f[0])[-n:]]


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", errors="replace")
