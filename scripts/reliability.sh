#!/usr/bin/env bash
# Runs the fault, bad-input and security tests on the real control plane and writes
# docs/reliability.md: each fault, what the test checks, and the result of this run.
#
#   scripts/reliability.sh            (about 3 minutes warm; starts the control planes itself)
#
# The load/soak figures come from `cargo bench --bench load` (benches/results/load.md) and are
# linked, not re-run here.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

out=docs/reliability.md
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# test name | fault | what is checked
read -r -d '' table <<'EOF_TABLE'
quotas_converge_after_apiserver_and_etcd_restarts|kube-apiserver killed (SIGKILL) and restarted twice, then etcd restarted, with creates and deletes during the outages|every quota's status.used equals `lazyquota usage` (direct lists)
cuts_and_compaction_under_racing_churn_lose_nothing|a loopback TCP proxy cuts lazyquota's connections at random; etcd compacted twice a second with the watch cache off; 1,000 racing creates and deletes|convergence to `lazyquota usage`; the exact object count; the watch relisted (410 Gone)
a_concurrent_status_writer_does_not_win|another writer updates the same quota status (conflicts)|lazyquota's value wins back; no lost update
a_forbidden_resource_type_withholds_only_its_own_keys|403 on list/watch of one constrained type|only its key keeps its value; Event; lazyquota_watch_failing names it; other keys current
a_crd_with_a_broken_conversion_webhook_withholds_only_its_key|a CRD whose conversion webhook does not answer|its key withheld (not a false 0); Event; failing-watch metric; other keys current
an_unavailable_apiservice_holds_only_its_keys|an APIService with no backend (aggregated discovery: Stale)|its key keeps its previous value; Event; lazyquota_unavailable_api_groups; other keys current
quota_on_a_crd_created_later_and_a_crd_deleted_while_watched|a CRD deleted while watched, and one created after its quota|the watch stops / starts; status follows
a_namespace_deleted_with_quotas_releases_its_watches|a namespace deleted with its quotas in it|its watches stop; a quota elsewhere on the same type keeps working
a_quota_edited_from_one_type_to_another_moves_the_watch|a quota edited from count/x to count/y|the watch moves from x to y; status.used holds y only
a_standby_takes_over_when_the_leader_dies_and_never_both_lead|the leader killed (SIGKILL) in the middle of status writes; SIGTERM|the standby wrote nothing before; takes over; converges; never two leaders; SIGTERM exits 0 and releases the Lease
absurd_values_and_ten_thousand_keys_break_nothing|absurd values (1e18, 8Ei) and 10,000 hard keys in one quota|computed; no panic; the other quota unaffected
a_quota_that_got_past_validation_is_reported_and_isolated|a quota written to etcd directly: unknown scope, malformed hard keys|InvalidSpec and StatusRejected Events naming them; the other quota unaffected
bad_input_gives_one_clear_error_line_and_a_non_zero_exit|CLI: unreadable/garbled kubeconfig, unreachable server, bad flags, bad cluster flags, missing TLS files|one clear line, non-zero exit, no backtrace
metrics_behind_delegated_authentication_and_authorization|/metrics with no token, a bad token, an unauthorised and an authorised ServiceAccount|401 / 401 / 403 / 200 over HTTPS; /healthz open; no token in the debug log
the_charts_service_account_does_the_whole_job_and_no_more|lazyquota run with exactly the chart's RBAC (TokenRequest token), debug logging|the whole job works; writes outside the chart's grant get 403; the token never appears in the log
one_process_serves_three_clusters_independently|three clusters (kube-apiservers on one etcd) in one process|each cluster's status is its own; watches only where demanded; a quota deleted in one cluster stops only its watch
EOF_TABLE

start=$SECONDS
cargo test --locked --test recovery --test churn --test conflicts --test faults --test lazy \
  --test operate --test cli --test multicluster 2>&1 | tee "$log" | grep -E '^test .* \.\.\. ' >&2
status=${PIPESTATUS[0]}
elapsed=$((SECONDS - start))

{
  echo "# Reliability report"
  echo
  echo "Produced by \`scripts/reliability.sh\` on $(date -u +%Y-%m-%d) at commit \`$(git rev-parse --short HEAD)\`"
  echo "($(nproc) cores; the test run took ${elapsed} s). Every test runs against the real control plane"
  echo "(etcd, kube-apiserver and kube-controller-manager v1.36.3 built from the Go modules, on loopback);"
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
  echo "recomputation); figures of the last long runs are in README.md. Not part of CI (nightly-only"
  echo "sanitizer flags, unlocked on stable with RUSTC_BOOTSTRAP=1)."
  echo
  echo "## Supply chain"
  echo
  echo "\`scripts/deny.sh\` (in CI): licences, bans and sources of every crate; RustSec advisories"
  echo "when the database can be fetched, skipped with one line when offline."
} >"$out"
echo "reliability: wrote $out (tests exit status $status)" >&2
exit "$status"
