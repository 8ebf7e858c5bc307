#!/usr/bin/env python3
"""Where a new quota's first status took its time, from a lazyquota log.

Reads the debug lines of `lazyquota_kube::controller::trace` (run lazyquota with
`RUST_LOG=info,lazyquota_kube::controller::trace=debug`, text log format) and, for every quota
named NAME (each by its uid), prints the time from lazyquota seeing it to each step of
its first status: discovery, its watch's list or its share's list (on kcp begun beside the
discovery when the shard's other workspaces serve the type alike), the write. Then the p50 and
p99 of each phase over all of them, and the samples that waited for a count split by whether
lazyquota had begun a list of the same type in the 100 ms before (the apiserver asks etcd for
the progress a consistent list of a type waits for at most once per 100 ms per type:
`progressRequestPeriod` in k8s.io/apiserver's cacher), and the lists by how long before
lazyquota had begun its previous list of the same type.

    python3 scripts/first-status.py LOG [--name sample]
"""

import argparse
import re
import sys
from datetime import datetime

from latency_table import row

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LINE = re.compile(r"^(\S+)\s+DEBUG\s+(?:\S+:\s+)?lazyquota_kube::controller::trace:\s+(.*?)((?:\s+\w+=\S+)*)\s*$")
FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
PHASES = [
    ("to discovery", "seen", "discovering"),
    ("discovery", "discovering", "discovered"),
    ("  of which /api and /apis", "discovering", "walking"),
    ("  of which the group walk", "walking", "discovered"),
    ("to list", "discovered", "listing"),
    ("list", "listing", "listed"),
    ("to write", "ready", "writing"),
    ("write", "writing", "written"),
    ("seen to written", "seen", "written"),
]


def parse(path):
    for raw in open(path, encoding="utf-8", errors="replace"):
        m = LINE.match(ANSI.sub("", raw.rstrip("\n")))
        if not m:
            continue
        stamp, message, fields = m.groups()
        at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        values = {k: v.strip('"') for k, v in FIELD.findall(fields)}
        yield at, message.strip(), values


def samples(path, name):
    open_ = {}  # cluster -> sample (phase -> time)
    watch_of = {}  # watch id -> cluster
    shares = []  # clusters listing a share, in order
    done = []
    seen = set()  # uids of quotas already started
    closed = {}  # cluster -> when its last sample was written
    resource_of = {}  # cluster -> the type its first list read
    reads = []  # (when, type) of every list begun, a watch's or a share's
    for at, message, f in parse(path):
        cluster = f.get("cluster", "")
        first_read = False
        gap = None
        if message in ("opening watch", "listing share") and "resource" in f:
            resource_of.setdefault(cluster, f["resource"])
            first_read = all(r != f["resource"] for _, r in reads)
            before = [t for t, r in reads if r == f["resource"]]
            gap = at - before[-1] if before else None
            reads.append((at, f["resource"]))
        if message == "quota seen" and f.get("quota") == name and cluster not in open_:
            # A quota's first event starts a sample; the events of its own status writes do
            # not (by uid; a log without uids: not within 0.2 s of the cluster's last write).
            uid = f.get("uid")
            if uid is not None and uid in seen:
                continue
            if uid is None and at - closed.get(cluster, -1e9) < 0.2:
                continue
            seen.add(uid)
            open_[cluster] = {"seen": at, "cluster": cluster}
        elif message == "discovering" and cluster in open_:
            open_[cluster].setdefault("discovering", at)
        elif message == "discovery: walking the groups":
            c = f.get("prefix", "").rsplit("/", 1)[-1]
            if c in open_:
                open_[c].setdefault("walking", at)
                open_[c].setdefault("group_versions", f.get("group_versions"))
        elif message == "discovered" and cluster in open_:
            open_[cluster].setdefault("discovered", at)
        elif message == "opening watch" and cluster in open_:
            watch_of[f.get("id")] = cluster
            open_[cluster].setdefault("listing", at)
            open_[cluster].setdefault("first_read", first_read)
            open_[cluster].setdefault("list_gap", gap)
        elif message == "listed" and watch_of.get(f.get("id")) in open_:
            open_[watch_of[f["id"]]].setdefault("listed", at)
        elif message == "listing share" and cluster in open_:
            shares.append(cluster)
            open_[cluster].setdefault("listing", at)
            open_[cluster].setdefault("first_read", first_read)
            open_[cluster].setdefault("list_gap", gap)
        elif message == "share listed" and shares:
            c = shares.pop(0)
            if c in open_:
                open_[c].setdefault("listed", at)
        elif message in ("writing status", "status written"):
            key = f.get("key", "")
            c = key.split("|", 1)[0]
            if c in open_ and key.endswith("/" + name):
                if message == "writing status":
                    open_[c].setdefault("writing", at)
                else:
                    s = open_.pop(c)
                    s["written"] = at
                    r = resource_of.get(c)
                    s["read_before"] = any(
                        t <= s["seen"] and s["seen"] - t < 0.1 and rr == r for t, rr in reads
                    )
                    closed[c] = at
                    if "listed" in s:
                        # The write waits for the list and, where the list began on a guess
                        # before the discovery answered, for the discovery too.
                        s["ready"] = max(s["listed"], s.get("discovered", s["listed"]))
                    if "discovered" in s and "listing" in s:
                        s["beside"] = s["listing"] < s["discovered"]
                    done.append(s)
    return done


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--name", default="sample")
    args = parser.parse_args()
    found = samples(args.log, args.name)
    if not found:
        sys.exit(f"error: no quota {args.name!r} created and written in {args.log} (is the trace target at debug?)")
    print(f"{len(found)} first statuses of quotas named {args.name!r}\n")
    print("| phase | n | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|")
    rows = []
    for label, a, b in PHASES:
        rows.append((label, a, b, None))
        if label == "to list":
            rows[-1] = ("to list, after the discovery answered", a, b, "after")
            rows.append(("  lists begun before it answered (on a guess): seen to listing", "seen", b, "beside"))
        if label == "list":
            # The shard builds a type's serving storage at its first request after a restart.
            rows.append(("  the type's first list in this log", a, b, "first"))
            rows.append(("  a type listed before", a, b, "again"))
    # A sample on a type its workspace already watches discovers nothing: its time before the
    # write is the wait for a count of the type's objects, if its key needed one.
    rows += [
        ("seen to written, discovered (cold, warm)", "seen", "written", True),
        ("  its list begun on a guess, before the discovery answered", "seen", "written", "beside"),
        ("  its list begun after the discovery answered", "seen", "written", "after"),
        ("seen to written, not discovered (watched)", "seen", "written", False),
        ("  of which seen to writing (a count)", "seen", "writing", False),
        ("    the type read in the 100 ms before", "seen", "writing", "read"),
        ("    the type not read in the 100 ms before", "seen", "writing", "not read"),
    ]

    def chosen(s, discovered):
        if discovered in ("after", "beside"):
            return "beside" in s and s["beside"] == (discovered == "beside")
        if discovered in ("first", "again"):
            return s.get("first_read") == (discovered == "first")
        if discovered in ("read", "not read"):
            return "discovering" not in s and s["read_before"] == (discovered == "read")
        return discovered is None or ("discovering" in s) == discovered

    for label, a, b, discovered in rows:
        d = [1000 * (s[b] - s[a]) for s in found if a in s and b in s and chosen(s, discovered)]
        if d:
            print(row(label, d))

    # A consistent list waits for the apiserver's cache to catch up with etcd, and the cache asks
    # etcd for that progress at most once per period per type: lists of a type read a moment
    # before wait. By how long before lazyquota had begun its previous list of the type:
    print("\n| list, the type's previous list begun | n | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|")
    buckets = [("under 100 ms before", 0, 0.1), ("100–150 ms before", 0.1, 0.15),
               ("150–500 ms before", 0.15, 0.5), ("500 ms or more before", 0.5, float("inf"))]
    for label, lo, hi in buckets:
        d = [1000 * (s["listed"] - s["listing"]) for s in found
             if "listed" in s and s.get("list_gap") is not None and lo <= s["list_gap"] < hi]
        if d:
            print(row(label, d))


if __name__ == "__main__":
    main()
