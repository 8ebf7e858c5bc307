#!/usr/bin/env bash
# Runs the fault, bad-input and security tests on the real control plane and writes
# docs/reliability.md: each fault, what the test checks, and the result of this run.
#
#   scripts/reliability.sh                     run the tests (about 5 minutes warm; starts the
#                                              control planes and the kcp shard itself)
#   scripts/reliability.sh --write LOG         write docs/reliability.md from the output LOG of
#                                              `cargo test --workspace` (no test run), e.g. after
#                                              a new faults.tsv
#   scripts/reliability.sh --check LOG         CI (scripts/test.sh): build the report from the
#                                              output LOG of `cargo test --workspace`, and fail
#                                              if docs/reliability.md does not say the same
#                                              (a test added, renamed, described differently or
#                                              failing): the committed report is never older
#                                              than the tests it summarises
#
# The load/soak figures come from `cargo bench --bench load` (benches/results/load.md) and are
# linked, not re-run here.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=docs/reliability.md
check_log=
from_log=
if [[ ${1:-} == --check ]]; then
  check_log=${2:?usage: scripts/reliability.sh --check LOG}
  from_log=$check_log
  out=$(mktemp)
elif [[ ${1:-} == --write ]]; then
  from_log=${2:?usage: scripts/reliability.sh --write LOG}
fi
log=$(mktemp)
trap 'rm -f "$log"; [[ -z $check_log ]] || rm -f "$out"' EXIT

# test name | fault | what is checked
read -r -d '' table <<'EOF_TABLE'
quotas_converge_after_apiserver_and_etcd_restarts|kube-apiserver killed (SIGKILL) and restarted twice, then etcd restarted, with creates and deletes during the outages|every quota's status.used equals `lazyquota usage` (direct lists)
cuts_and_compaction_under_racing_churn_lose_nothing|a loopback TCP proxy cuts lazyquota's connections at random; etcd compacted twice a second with the watch cache off; 1,000 racing creates and deletes|convergence to `lazyquota usage`; the exact object count; the watch relisted (410 Gone)
writers_racing_against_hard_never_get_past_it_and_status_converges|six writers creating and deleting ConfigMaps as fast as they can against a quota's hard (count/configmaps: 30), in two namespaces one after the other; quota admission charging every create before its object exists|never more objects than hard (an exact count from a watch in resourceVersion order); admission did refuse creates; status.used equals the objects within 10 s after the writers stop
a_concurrent_status_writer_does_not_win|another writer updates the same quota status (conflicts)|a 409 happened; the other writer keeps its own last version; lazyquota's value wins back
a_status_write_keeps_labels_and_annotations|lazyquota writes the status of a quota carrying labels and annotations (Helm's)|they are still there after the write (a JSON merge patch of the status, not a PUT)
a_forbidden_resource_type_withholds_only_its_own_keys|403 on list/watch of one constrained type|only its key keeps its value; Event; lazyquota_watch_failing names it; other keys current
unavailable::a_crd_with_a_broken_conversion_webhook_withholds_only_its_key|a CRD whose conversion webhook does not answer|its key withheld (not a false 0); Event; failing-watch metric; other keys current
unavailable::an_unavailable_apiservice_holds_only_its_keys|an APIService with no backend (aggregated discovery: Stale)|its key keeps its previous value; Event; lazyquota_unavailable_api_groups; other keys current
watches::quota_on_a_crd_created_later_and_a_crd_deleted_while_watched|a CRD deleted while watched, and one created after its quota|the watch stops / starts; status follows
watches::a_namespace_deleted_with_quotas_releases_its_watches|a namespace deleted with its quotas in it|its watches stop; a quota elsewhere on the same type keeps working
watches::a_quota_edited_from_one_type_to_another_moves_the_watch|a quota edited from count/x to count/y|the watch moves from x to y; status.used holds y only
leader::a_standby_takes_over_when_the_leader_dies_and_never_both_lead|the leader killed (SIGKILL) in the middle of status writes; SIGTERM|the standby wrote nothing before; takes over; converges; never two leaders; SIGTERM exits 0 and releases the Lease
enforcement::absurd_values_and_ten_thousand_keys_break_nothing|absurd values (1e18, 8Ei) and 10,000 hard keys in one quota|computed; no panic; the other quota unaffected
enforcement::huge_quantities_count_exactly_and_beyond_range_keys_are_withheld|tenant pods asking for 1e30 and 1e2000 bytes of memory|every pod counts in pods and count/pods; memory summed exactly (3e30 + 64Mi, after a delete); the 1e2000 key withheld with an Event (admission refuses to charge it), never lowered
leader::a_black_holed_leader_stops_before_the_standby_takes_over|the leader's connection to the apiserver black-holed (a proxy that stops forwarding and closes nothing)|the leader stops within its renew deadline and exits; the standby leads only after that: never two leaders
unavailable::a_quota_that_got_past_validation_is_reported_and_isolated|a quota written to etcd directly: unknown scope, malformed hard keys|InvalidSpec and StatusRejected Events naming them; the other quota unaffected
bad_input_gives_one_clear_error_line_and_a_non_zero_exit|CLI: unreadable/garbled kubeconfig, unreachable server, bad flags, bad cluster flags, missing TLS files|one clear line, non-zero exit, no backtrace
serving::metrics_behind_delegated_authentication_and_authorization|/metrics with no token, a bad token, an unauthorised and an authorised ServiceAccount|401 / 401 / 403 / 200 over HTTPS; /healthz open; no token in the debug log
chart::the_charts_service_account_does_the_whole_job_and_no_more|lazyquota run with exactly the chart's RBAC (TokenRequest token), debug logging|the whole job works; writes outside the chart's grant get 403; the token never appears in the log
one_process_serves_three_clusters_independently|three clusters (kube-apiservers on one etcd) in one process|each cluster's status is its own; watches only where demanded; a quota deleted in one cluster stops only its watch
cuts::counts_stay_exact_through_watch_cuts_and_paginated_lists|kcp shard: every connection cut after 0.1–2 s over HTTP/2 while objects of a bound type and 620 configmaps (paginated lists) are created and deleted|every count exact once the cuts stop
cluster_scoped::a_cluster_scoped_quota_counts_every_namespace_as_kcp_does|kcp: a cluster-scoped quota (admin namespace, kcp annotation) over a workspace with objects in 4 namespaces|lazyquota computes what kcp's own controller wrote, value for value
cluster_scoped::lazyquota_writes_kcps_cluster_scoped_quota|kcp: lazyquota as the only writer of a cluster-scoped quota|the count of every namespace; the annotation survives the write; kcp's admission enforces it
shadow::shadow_mode_agrees_with_kcps_own_quota_controller|kcp: shadow mode next to kcp's own quota controller, after creates and deletes|no disagreement once both settled
shards::one_lazyquota_per_shard_in_shadow_mode_agrees_with_kcp_on_every_shard|sharded kcp (a root shard and two more, a cache server, a front-proxy), kcp's own quota controller on every shard, an export on the root shard bound on all three, one lazyquota per shard in shadow mode|each serves only its own shard's logical clusters and agrees with kcp key for key, nothing unknown, nothing written
shards::one_lazyquota_per_shard_counts_exactly_through_restarts_schema_updates_and_deletes|sharded kcp, one lazyquota per shard as the only writer: the export's schema updated on the root shard, shard-1 restarted (SIGTERM, killed after 15 s, started again on its data) while deletes happen on the other shards, a consumer workspace deleted on shard-2|every quota equals a list of its objects; deletes counted on the other shards during the restart and on shard-1 after it; kcp's admission on shard-2 enforces what lazyquota wrote
EOF_TABLE

start=$SECONDS
if [[ -n $from_log ]]; then
  cp "$from_log" "$log"
  status=0
else
  cargo test --locked --test recovery --test churn --test hard_churn --test conflicts --test faults --test lazy \
    --test operate --test cli --test multicluster --test kcp 2>&1 | tee "$log" | grep -E '^test .* \.\.\. ' >&2
  status=${PIPESTATUS[0]}
fi
elapsed=$((SECONDS - start))

{
  echo "# Reliability report"
  echo
  commit=$(git rev-parse --short HEAD)
  git diff --quiet HEAD -- . ':!docs/reliability.md' || commit="$commit + uncommitted changes"
  echo "Produced by \`scripts/reliability.sh\` on $(date -u +%Y-%m-%d) at commit \`$commit\`"
  if [[ -n $from_log && -z $check_log ]]; then
    ran="from the log of a \`cargo test --workspace\` run"
  else
    ran="the test run took ${elapsed} s"
  fi
  echo "($(nproc) cores; $ran). Every test runs against the real control plane"
  echo "(etcd, kube-apiserver and kube-controller-manager v1.36.3 built from the Go modules, and a kcp"
  echo "v0.32.3 shard built from its source, on loopback). CI rebuilds this table from its own test run"
  echo "and fails if it differs from this file (\`scripts/reliability.sh --check\`);"
  echo "\"converges\" means every quota's \`status.used\` equals what \`lazyquota usage\` computes from direct lists."
  echo
  echo "| fault | checked | test | result |"
  echo "|---|---|---|---|"
  while IFS='|' read -r name fault checked; do
    [[ -n $name ]] || continue
    line=$(grep -E "^test ${name} \.\.\. " "$log" | head -n 1)
    case $line in
      *" ... ok") result="pass" ;;
      *" ... FAILED") result="**FAIL**" ;;
      *) result="not run" ;;
    esac
    echo "| ${fault} | ${checked} | \`${name}\` | ${result} |"
  done <<<"$table"
  echo
  echo "## The same faults against KCM's quota controller"
  echo
  faults=benches/results/faults/faults.tsv
  if [[ -f $faults ]]; then
    echo "From \`cargo bench --bench faults\` ([benches/results/faults/faults.md](../benches/results/faults/faults.md),"
    echo "commit \`$(awk -F'\t' 'NR == 2 { print $12 }' "$faults")\`): each fault on a fresh control plane, once with KCM running only its"
    echo "resource quota controller and once with lazyquota, the same script and data. Per cell: new quotas"
    echo "created during the fault that had no status 60 s after its end; creates admitted in a namespace"
    echo "churning against \`count/configmaps: 30\` meanwhile, and its peak (an exact count); how long"
    echo "\`status.used\` took to equal the objects once the writers stopped. CI runs F1, F4 and F6 bounded."
    echo
    echo "| fault | KCM's quota controller | lazyquota | result file |"
    echo "|---|---|---|---|"
    awk -F'\t' '
      NR == 1 { next }
      {
        converged = ($11 == "-") ? "never converged" : "converged in " $11 " s"
        cell = $4 " of " $3 " new quotas without status; " $6 " creates, peak " $9 "/" $10 "; " converged
        if (!($1 in seen)) { order[++n] = $1; seen[$1] = 1 }
        if ($2 == "KCM") kcm[$1] = cell; else lazy[$1] = cell
        what[$1] = $13
      }
      END { for (i = 1; i <= n; i++) printf "| %s: %s | %s | %s | `benches/results/faults/faults.md` |\n", order[i], what[order[i]], kcm[order[i]], lazy[order[i]] }
    ' "$faults"
    echo
    echo "Where lazyquota does worse than KCM in these rows, and why:"
    echo
    echo "- **Creates admitted, and convergence, after a restart under churn** (creates: F5-nocache,"
    echo "  F6, F7; convergence: F4, F5, F5-nocache, F8): when lazyquota starts again or its watches"
    echo "  relist after an outage,"
    echo "  the quota's stored \`used\` holds charges quota admission"
    echo "  made while nothing watched, for ConfigMaps created and often deleted again before the watch"
    echo "  resumed. No event will pay them, and nothing a client can read tells them from creates still"
    echo "  on their way, so lazyquota holds them until the create bound (kube-apiserver's request"
    echo "  timeout, one minute): the churning tenant gets fewer creates meanwhile, and \`used\` equals"
    echo "  the objects only after the bound. KCM's controller recomputes from its informers at once, so"
    echo "  its \`used\` drops below the objects in flight and the namespace goes past \`hard\` (its"
    echo "  peaks in the same rows). docs/design.md, \"Known limits\", says what a fix would need."
    echo "- **Convergence after churn without a restart**: a create admission charged and then refused"
    echo "  holds its unit up to the same bound (docs/design.md, \"Known limits\")."
  else
    echo "Not measured yet: \`cargo bench --bench faults\` writes benches/results/faults/faults.tsv."
  fi
  echo
  echo "## What no controller can work around"
  echo
  echo "A quota whose *quantity* is malformed in etcd (written past validation, e.g. \`hard: {count/configmaps: 12x}\`)"
  echo "cannot be decoded by the apiserver itself: every ResourceQuota list and watch fails with"
  echo "\`quantities must match the regular expression ...\` (checked by hand on the test control plane,"
  echo "2026-11-30). lazyquota's quota watch then retries with backoff and logs it, keeping what it knew;"
  echo "KCM is stopped the same way. Malformed *keys* and unknown scopes decode fine and are tested above."
  echo
  echo "## Load and soak"
  echo
  echo "From \`cargo bench --bench load\` (5,000 quotas, 500 namespaces, 50,000 objects, 200 deletes/s"
  echo "for 60 s, a 10-minute churn soak): see [benches/results/load.md](../benches/results/load.md)."
  echo "CI runs the bounded version (\`-- --quick\`) on every change."
  echo
  echo "## Fuzzing"
  echo
  echo "\`scripts/fuzz.sh SECONDS\` runs the cargo-fuzz targets \`quantity\`, \`quota_spec\` and"
  echo "\`policy_index\` (PolicyIndex event sequences in two clusters against a from-scratch"
  echo "recomputation). Not part of CI (nightly-only sanitizer flags, unlocked on stable with"
  echo "RUSTC_BOOTSTRAP=1), and no long run's figures are recorded: this report claims none."
  echo
  echo "## Supply chain"
  echo
  echo "\`scripts/deny.sh\` (in CI): licences, bans and sources of every crate; RustSec advisories"
  echo "when the database can be fetched, skipped with one line when offline."
} >"$out"
if [[ -n $check_log ]]; then
  # The table rows only: the header names the commit, date and duration of one run.
  rows() { grep -E '^\| ' "$1" | grep -v -E '^\| (fault|---)'; }
  if ! diff <(rows docs/reliability.md) <(rows "$out") >&2; then
    echo "reliability: docs/reliability.md differs from this run's results (above: < committed, > this run);" >&2
    echo "reliability: run scripts/reliability.sh and commit docs/reliability.md" >&2
    exit 1
  fi
  if rows "$out" | grep -q -E '\| (\*\*FAIL\*\*|not run) \|$'; then
    echo "reliability: a fault test failed or did not run" >&2
    exit 1
  fi
  echo "reliability: docs/reliability.md matches this run" >&2
  exit 0
fi
echo "reliability: wrote $out (tests exit status $status)" >&2
exit "$status"
