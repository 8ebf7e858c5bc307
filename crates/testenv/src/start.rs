//! Starting (or reusing) a control plane shared by every test binary of the checkout.

use std::{collections::BTreeMap, ffi::OsStr, process::Command};

use crate::{ControlPlane, Error, Flavor, lock_state, read_facts, repo_root};

/// Starts (or reuses) the control plane of `flavor` shared by all test binaries of this checkout.
pub(crate) fn start_shared(flavor: Flavor) -> Result<ControlPlane, Error> {
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

    run_script(
        "tests/control-plane/start.sh",
        &[],
        &[
            ("LAZYQUOTA_CP_DIR", dir.as_os_str()),
            ("LAZYQUOTA_KCM_QUOTA", flavor.kcm_quota().as_ref()),
            ("LAZYQUOTA_EXTRA_APISERVERS", flavor.extra_apiservers().as_ref()),
            ("LAZYQUOTA_APISERVER_ARGS", flavor.apiserver_args().as_ref()),
        ],
    )?;
    let facts = read_facts(&facts_path)?;
    Ok(ControlPlane {
        flavor,
        kubeconfig: dir.join("admin.kubeconfig"),
        facts,
    })
}

/// Runs `bash <repo>/<script> <args>` with `envs` set; its standard error is the error's
/// message when it fails.
pub(crate) fn run_script(script: &str, args: &[&OsStr], envs: &[(&str, &OsStr)]) -> Result<(), Error> {
    let script = repo_root().join(script);
    let output = Command::new("bash")
        .arg(&script)
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .map_err(|e| Error::Start {
            script: script.clone(),
            message: e.to_string(),
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Start {
            script,
            message: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
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
