//! Starting (or reusing) a control plane shared by every test binary of the checkout.

use std::{collections::BTreeMap, process::Command};

use crate::{ControlPlane, Error, Flavor, lock_state, read_facts, repo_root};

/// Starts (or reuses) the control plane of `flavor` shared by all test binaries of this checkout.
pub(crate) fn start_shared(flavor: Flavor) -> Result<ControlPlane, Error> {
    let root = repo_root();
    let (dir, _lock) = lock_state(flavor.dir_name())?;

    let facts_path = dir.join("env");
    if let Ok(facts) = read_facts(&facts_path)
        && facts
            .get("LAZYQUOTA_APISERVER_URL")
            .is_some_and(|url| apiserver_ready(url, &facts))
    {
        return Ok(ControlPlane {
            flavor,
            kubeconfig: dir.join("admin.kubeconfig"),
            facts,
        });
    }

    let script = root.join("tests/control-plane/start.sh");
    let output = Command::new("bash")
        .arg(&script)
        .env("LAZYQUOTA_CP_DIR", &dir)
        .env("LAZYQUOTA_KCM_QUOTA", flavor.kcm_quota())
        .env("LAZYQUOTA_EXTRA_APISERVERS", flavor.extra_apiservers())
        .env("LAZYQUOTA_APISERVER_ARGS", flavor.apiserver_args())
        .output()
        .map_err(|e| Error::Start {
            script: script.clone(),
            message: e.to_string(),
        })?;
    if !output.status.success() {
        return Err(Error::Start {
            script,
            message: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let facts = read_facts(&facts_path)?;
    Ok(ControlPlane {
        flavor,
        kubeconfig: dir.join("admin.kubeconfig"),
        facts,
    })
}

/// Whether a previously started apiserver still answers `/readyz` (checked with curl so that
/// no async runtime is needed here).
pub(crate) fn apiserver_ready(url: &str, facts: &BTreeMap<String, String>) -> bool {
    let (Some(ca), Some(cert), Some(key)) = (
        facts.get("LAZYQUOTA_CA_FILE"),
        facts.get("LAZYQUOTA_ADMIN_CERT"),
        facts.get("LAZYQUOTA_ADMIN_KEY"),
    ) else {
        return false;
    };
    Command::new("curl")
        .args([
            "-fsS",
            "--max-time",
            "3",
            "--cacert",
            ca,
            "--cert",
            cert,
            "--key",
            key,
        ])
        .arg(format!("{url}/readyz"))
        .output()
        .is_ok_and(|o| o.status.success())
}
