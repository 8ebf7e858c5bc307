//! The `lazyquota` binary as a user runs it: `usage` and `explain` against the real control
//! plane, and one clear error line with a non-zero exit for bad input.

mod common;

use std::{path::Path, process::Command};

use k8s_openapi::{
    api::core::v1::{ResourceQuota, ResourceQuotaSpec},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use lazyquota_testenv::{ControlPlane, Flavor, TestNamespace};

fn lazyquota(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lazyquota"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .expect("run lazyquota")
}

fn kubeconfig() -> String {
    ControlPlane::get(Flavor::LazyquotaOnly)
        .kubeconfig()
        .display()
        .to_string()
}

#[tokio::test]
async fn usage_and_explain_report_a_quota_from_direct_lists() {
    let ns = TestNamespace::create(Flavor::LazyquotaOnly, "cli")
        .await
        .expect("namespace");
    common::create_configmap(&ns, "one").await;
    let hard = [
        ("count/configmaps", "9"),
        ("limits.example.com/gpu", "1"),
        ("count/nothings.example.io", "1"),
    ];
    let quota = ResourceQuota {
        metadata: ObjectMeta {
            name: Some("q".into()),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(
                hard.iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect(),
            ),
            ..ResourceQuotaSpec::default()
        }),
        ..ResourceQuota::default()
    };
    ns.api::<ResourceQuota>()
        .create(&PostParams::default(), &quota)
        .await
        .expect("quota");
    // A value stored under the key no evaluator claims (another writer's, or one carried
    // forward): nobody computed it, so usage must not show it as computed.
    ns.api::<ResourceQuota>()
        .patch_status(
            "q",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {
                "hard": hard.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect::<std::collections::BTreeMap<_, _>>(),
                "used": {"limits.example.com/gpu": "2"},
            }})),
        )
        .await
        .expect("status with a value under the unclaimed key");
    let kubeconfig = kubeconfig();

    let out = lazyquota(&[
        "usage",
        "--kubeconfig",
        &kubeconfig,
        "-n",
        ns.name(),
        "-o",
        "json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("usage -o json is JSON");
    let keys = &report[0]["keys"];
    let key = |name: &str| {
        keys.as_array()
            .unwrap()
            .iter()
            .find(|k| k["key"] == name)
            .cloned()
            .unwrap()
    };
    // The namespace holds the root CA ConfigMap and ours.
    assert_eq!(key("count/configmaps")["computed"], "2");
    assert_eq!(
        key("limits.example.com/gpu")["computed"],
        serde_json::Value::Null,
        "never computed"
    );
    assert_eq!(
        key("count/nothings.example.io")["computed"],
        serde_json::Value::Null,
        "not served"
    );
    // A type not served is unknown (an evaluator would claim it once served); a key no
    // evaluator claims is computed by nobody, KCM included: its stored value is unknown too,
    // as shadow mode calls it, never computed and never agreeing.
    let pending = key("count/nothings.example.io");
    assert!(
        pending["unknown"].is_string(),
        "a pending type is reported unknown, with why"
    );
    assert_eq!(pending["differs"], false, "unknown is not a disagreement");
    let unclaimed = key("limits.example.com/gpu");
    assert_eq!(unclaimed["stored"], "2");
    assert!(
        unclaimed["unknown"]
            .as_str()
            .is_some_and(|why| why.contains("no evaluator")),
        "a key no evaluator claims is reported unknown, with why: {unclaimed}"
    );
    assert_eq!(unclaimed["differs"], false, "unknown is not a disagreement");
    assert!(key("count/configmaps").get("unknown").is_none());

    let out = lazyquota(&["explain", "--kubeconfig", &kubeconfig, "-o", "json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let explain: serde_json::Value = serde_json::from_slice(&out.stdout).expect("explain -o json is JSON");
    let clusters = explain.as_array().expect("one report per cluster");
    assert_eq!(clusters.len(), 1, "one cluster without cluster flags");
    let explain = &clusters[0];
    assert_eq!(explain["cluster"], "default");
    assert_eq!(
        explain["release"], "1.36",
        "the test control plane's release, read from /version"
    );
    assert!(
        explain["gates"]
            .as_str()
            .unwrap()
            .contains("DRAExtendedResource=true"),
        "1.36's defaults: {}",
        explain["gates"]
    );
    let changed = lazyquota(&[
        "explain",
        "--kubeconfig",
        &kubeconfig,
        "-o",
        "json",
        "--feature-gates",
        "DRAExtendedResource=false",
    ]);
    assert!(
        changed.status.success(),
        "{}",
        String::from_utf8_lossy(&changed.stderr)
    );
    let changed: serde_json::Value = serde_json::from_slice(&changed.stdout).expect("JSON");
    assert!(
        changed[0]["gates"]
            .as_str()
            .unwrap()
            .contains("DRAExtendedResource=false")
    );
    let resources = explain["resources"].as_array().expect("resources");
    let pending = resources
        .iter()
        .find(|r| r["resource"] == "count/nothings.example.io")
        .expect("pending resource listed");
    assert!(pending["pending"].as_str().unwrap().contains("not served"));
    let configmaps = resources
        .iter()
        .find(|r| r["resource"] == "count/configmaps")
        .expect("configmaps listed");
    assert_eq!(configmaps["watch"], "metadata");
    assert!(
        configmaps["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == ns.name())
    );
    // The scope and its reason come from the watch planner the controller uses, with the
    // flags `run` takes.
    assert_eq!(pending["scope"], "-", "nothing watched while pending");
    assert_eq!(configmaps["scope"], "namespaced");
    assert!(
        configmaps["scope_reason"]
            .as_str()
            .unwrap()
            .ends_with("within --namespace-watch-threshold 8"),
        "{configmaps}"
    );
    let explain_with = |flags: &[&str]| -> serde_json::Value {
        let mut args = vec!["explain", "--kubeconfig", &kubeconfig, "-o", "json"];
        args.extend_from_slice(flags);
        let out = lazyquota(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        report[0]["resources"].clone()
    };
    let find = |resources: &serde_json::Value, name: &str| {
        resources
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["resource"] == name)
            .cloned()
    };
    let low = explain_with(&["--namespace-watch-threshold", "0"]);
    let configmaps = find(&low, "count/configmaps").expect("configmaps listed");
    assert_eq!(configmaps["scope"], "cluster-wide");
    assert!(
        configmaps["scope_reason"]
            .as_str()
            .unwrap()
            .contains("above --namespace-watch-threshold 0"),
        "{configmaps}"
    );
    let eager = explain_with(&["--mode", "eager"]);
    for name in ["count/configmaps", "count/pods"] {
        let r = find(&eager, name).unwrap_or_else(|| panic!("eager mode lists {name}"));
        assert_eq!(r["scope"], "cluster-wide", "{r}");
        assert!(
            r["scope_reason"].as_str().unwrap().starts_with("eager mode"),
            "{r}"
        );
    }
    assert_eq!(find(&eager, "count/pods").unwrap()["watch"], "typed");
    let never = format!("{}/q: limits.example.com/gpu", ns.name());
    assert!(
        explain["never_computed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k == never.as_str())
    );

    let table = lazyquota(&["explain", "--kubeconfig", &kubeconfig]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("RESOURCE"));
    ns.delete().await.expect("delete namespace");
}

fn assert_one_line_error(out: &std::process::Output, needle: &str) {
    assert!(!out.status.success(), "must fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(needle),
        "stderr {stderr:?} should mention {needle:?}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("stack backtrace"),
        "{stderr}"
    );
}

/// The binary carries its relative relocations packed (`build.rs`): `readelf -d` lists a RELR
/// entry. Without it the dynamic linker reads ~1.1 MB of relocations at every start, and they
/// stay resident.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn the_binary_packs_its_relative_relocations() {
    let dynamic = readelf("--dynamic");
    assert!(dynamic.contains("(RELR)"), "{dynamic}");
}

/// `readelf FLAG` of the binary under test (binutils), which must succeed.
fn readelf(flag: &str) -> String {
    let out = Command::new("readelf")
        .args([flag, env!("CARGO_BIN_EXE_lazyquota")])
        .output()
        .expect("readelf (binutils) runs");
    assert!(out.status.success(), "readelf {flag} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// The binary is linked statically (.cargo/config.toml): no program interpreter, no shared
// library, and yet a server given as `localhost` is reached, through glibc's own /etc/hosts
// lookup linked into it. (DNS goes through the same libc.a resolver; no test here reaches a
// DNS server.)
#[test]
fn the_binary_is_static_and_resolves_localhost_from_etc_hosts() {
    let headers = readelf("--program-headers");
    assert!(
        headers.contains("LOAD") && !headers.contains("INTERP"),
        "{headers}"
    );
    let dynamic = readelf("--dynamic");
    assert!(!dynamic.contains("(NEEDED)"), "{dynamic}");

    let real = std::fs::read_to_string(kubeconfig()).expect("the test kubeconfig");
    assert!(real.contains("https://127.0.0.1:"), "{real}");
    let dir = std::env::temp_dir().join(lazyquota_testenv::unique_name("cli-static"));
    std::fs::create_dir_all(&dir).unwrap();
    let by_name = dir.join("kubeconfig");
    std::fs::write(&by_name, real.replace("https://127.0.0.1:", "https://localhost:")).unwrap();
    let out = lazyquota(&["explain", "--kubeconfig", by_name.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn bad_input_gives_one_clear_error_line_and_a_non_zero_exit() {
    let missing = lazyquota(&["usage", "--kubeconfig", "/nonexistent/kubeconfig"]);
    assert_one_line_error(&missing, "cannot read kubeconfig /nonexistent/kubeconfig");
    assert_eq!(String::from_utf8_lossy(&missing.stderr).trim().lines().count(), 1);

    let dir = std::env::temp_dir().join(lazyquota_testenv::unique_name("cli"));
    std::fs::create_dir_all(&dir).unwrap();
    let garbage = dir.join("kubeconfig");
    std::fs::write(&garbage, "this: [is not a kubeconfig").unwrap();
    let garbled = lazyquota(&["explain", "--kubeconfig", garbage.to_str().unwrap()]);
    assert_one_line_error(&garbled, "cannot read kubeconfig");

    // A kubeconfig pointing at a loopback port nobody listens on.
    let unreachable = dir.join("unreachable");
    std::fs::write(
        &unreachable,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    )
    .unwrap();
    let refused = lazyquota(&["usage", "--kubeconfig", unreachable.to_str().unwrap()]);
    assert_one_line_error(&refused, "Connection refused");

    // Feature gates: syntax is checked at once; names and locks against the cluster's release.
    let syntax = lazyquota(&["usage", "--feature-gates", "DRAExtendedResource"]);
    assert_one_line_error(&syntax, "is not Name=true or Name=false");
    assert_eq!(syntax.status.code(), Some(2), "clap's usage error code");
    let real = kubeconfig();
    let real = Path::new(&real).to_str().unwrap();
    let locked = lazyquota(&[
        "usage",
        "--kubeconfig",
        real,
        "--feature-gates",
        "DynamicResourceAllocation=false",
    ]);
    assert_one_line_error(
        &locked,
        "cannot set feature gate DynamicResourceAllocation to false: it is locked to true in Kubernetes 1.36",
    );
    let unknown = lazyquota(&[
        "usage",
        "--kubeconfig",
        real,
        "--feature-gates",
        "NoSuchGate=true",
    ]);
    assert_one_line_error(
        &unknown,
        "unrecognized feature gate NoSuchGate for Kubernetes 1.36",
    );

    let flag = lazyquota(&["run", "--resync-period", "5x"]);
    assert_one_line_error(&flag, "unknown unit");
    assert_eq!(flag.status.code(), Some(2), "clap's usage error code");
    let context = lazyquota(&[
        "usage",
        "--kubeconfig",
        Path::new(&kubeconfig()).to_str().unwrap(),
        "--context",
        "nope",
    ]);
    assert_one_line_error(&context, "context \"nope\"");

    // Several clusters: a malformed flag, two clusters with one name, one missing file.
    let malformed = lazyquota(&["usage", "--cluster-kubeconfig", "=x"]);
    assert_one_line_error(&malformed, "expected FILE or NAME=FILE");
    let unreachable = unreachable.to_str().unwrap();
    let twice = lazyquota(&[
        "usage",
        "--cluster-kubeconfig",
        &format!("a={unreachable}"),
        "--cluster-kubeconfig",
        &format!("a={unreachable}x"),
    ]);
    assert_one_line_error(&twice, "two clusters are both named \"a\"");
    let gone = lazyquota(&[
        "usage",
        "--cluster-kubeconfig",
        &format!("a={unreachable}"),
        "--cluster-kubeconfig",
        "b=/nonexistent/kubeconfig",
    ]);
    assert_one_line_error(
        &gone,
        "cluster \"b\": cannot read kubeconfig /nonexistent/kubeconfig",
    );

    let tls = lazyquota(&[
        "run",
        "--kubeconfig",
        Path::new(&kubeconfig()).to_str().unwrap(),
        "--metrics-addr",
        "127.0.0.1:0",
        "--metrics-tls-cert-file",
        "/nonexistent/tls.crt",
        "--metrics-tls-key-file",
        "/nonexistent/tls.key",
    ]);
    assert_one_line_error(&tls, "cannot read --metrics-tls-cert-file /nonexistent/tls.crt");
    let half = lazyquota(&["run", "--metrics-tls-cert-file", "/x"]);
    assert_one_line_error(&half, "--metrics-tls-key-file");
}

/// `lazyquota_active_watches{resource, scope}` in a /metrics text (0 when absent).
fn active_watches(metrics: &str, resource: &str, scope: &str) -> usize {
    let series = format!("lazyquota_active_watches{{resource=\"{resource}\",scope=\"{scope}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `run` and `explain` given the same non-default flags plan the same watches: for each type
/// this test's quotas demand, the scope `explain` gives (namespaced: one watch per demanding
/// namespace; cluster-wide: one watch) is what the running binary reports in
/// `lazyquota_active_watches`. Lazy mode with `--namespace-watch-threshold 1` (configmaps
/// demanded in two namespaces: cluster-wide; secrets in one: namespaced), then eager mode
/// (every type cluster-wide). Both answers come from one planner, so they cannot disagree.
#[tokio::test]
async fn run_and_explain_plan_the_same_watches_with_the_same_flags() {
    let kubeconfig = kubeconfig();
    let a = TestNamespace::create(Flavor::LazyquotaOnly, "agree-a")
        .await
        .expect("namespace");
    let b = TestNamespace::create(Flavor::LazyquotaOnly, "agree-b")
        .await
        .expect("namespace");
    let pp = PostParams::default();
    a.api::<ResourceQuota>()
        .create(
            &pp,
            &common::quota("q", &[("count/configmaps", "10"), ("count/secrets", "10")]),
        )
        .await
        .expect("quota");
    b.api::<ResourceQuota>()
        .create(&pp, &common::quota("q", &[("count/configmaps", "10")]))
        .await
        .expect("quota");
    let lazy: &[&str] = &["--namespace-watch-threshold", "1"];
    let eager: &[&str] = &["--mode", "eager"];
    for (flags, want) in [
        (
            lazy,
            [
                ("count/configmaps", "cluster-wide"),
                ("count/secrets", "namespaced"),
            ],
        ),
        (
            eager,
            [
                ("count/configmaps", "cluster-wide"),
                ("count/secrets", "cluster-wide"),
            ],
        ),
    ] {
        let process =
            common::process::Lazyquota::start(Path::new(&kubeconfig), &[flags, &["--shadow"]].concat());
        let last = std::cell::RefCell::new(String::new());
        let agreed = lazyquota_testenv::eventually(std::time::Duration::from_mins(1), || {
            let (process, kubeconfig, last) = (&process, &kubeconfig, &last);
            async move {
                let mut args = vec!["explain", "--kubeconfig", kubeconfig, "-o", "json"];
                args.extend_from_slice(flags);
                let out = lazyquota(&args);
                let report: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
                let (_, metrics) = process.get("/metrics").await?;
                let mut disagreements = Vec::new();
                for (resource, scope) in want {
                    let r = report[0]["resources"]
                        .as_array()?
                        .iter()
                        .find(|r| r["resource"] == resource)?
                        .clone();
                    let label = resource.trim_start_matches("count/");
                    let running = (
                        active_watches(&metrics, label, "namespaced"),
                        active_watches(&metrics, label, "cluster"),
                    );
                    let explained = match r["scope"].as_str()? {
                        "cluster-wide" => (0, 1),
                        "namespaced" => (r["namespaces"].as_array()?.len(), 0),
                        _ => (0, 0),
                    };
                    if r["scope"] != scope || running != explained {
                        disagreements.push(format!(
                            "{resource}: explain {} over {} namespace(s) {explained:?}, run (namespaced, cluster) {running:?}",
                            r["scope"],
                            r["namespaces"].as_array()?.len()
                        ));
                    }
                }
                *last.borrow_mut() = disagreements.join("; ");
                disagreements.is_empty().then_some(())
            }
        })
        .await;
        assert!(agreed.is_some(), "flags {flags:?}: {}", last.borrow());
    }
    a.delete().await.expect("delete namespace");
    b.delete().await.expect("delete namespace");
}
