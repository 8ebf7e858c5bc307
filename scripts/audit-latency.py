#!/usr/bin/env python3
"""How long a kcp shard (or kube-apiserver) took to serve each ResourceQuota write, from its
audit log: per client (User-Agent), verb and subresource, the time from the request's arrival
to its response (`stageTimestamp` − `requestReceivedTimestamp` of the ResponseComplete event),
p50 / p90 / p99 / max — the server's own part of a client's round trip.

Start the server with `--audit-policy-file=benches/kcp/audit-policy.yaml
--audit-log-path=FILE` (the kcp benchmark: `LAZYQUOTA_KCP_ARGS="--audit-policy-file=...
--audit-log-path=..."`), then:

    python3 scripts/audit-latency.py FILE [--name sample]

Quotas named NAME (the kcp benchmark's latency samples) are reported apart from the others.
"""

import argparse
import collections
import json
from datetime import datetime

from latency_table import row


def seconds(stamp):
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log")
    parser.add_argument("--name", default="sample")
    args = parser.parse_args()
    served = collections.defaultdict(list)
    with open(args.log, encoding="utf-8") as log:
        for line in log:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            ref = event.get("objectRef") or {}
            if event.get("stage") != "ResponseComplete" or ref.get("resource") != "resourcequotas":
                continue
            if event["verb"] in ("get", "list", "watch"):
                continue
            agent = event.get("userAgent", "").split(" (")[0]
            which = args.name if ref.get("name") == args.name else "other"
            key = (agent, event["verb"], ref.get("subresource", ""), which)
            took = seconds(event["stageTimestamp"]) - seconds(event["requestReceivedTimestamp"])
            served[key].append(took * 1000)
    print("| client (User-Agent) | verb | subresource | quotas | n | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (agent, verb, sub, which), took in sorted(served.items()):
        label = f"{agent or '(none)'} | {verb} | {sub or '–'} | {which}"
        print(row(label, took, (50, 90, 99)))


if __name__ == "__main__":
    main()
