//! A sharded kcp for the integration tests, as the seed scenario ran it: a root shard and two
//! more, a cache server and a front-proxy, started on loopback by
//! `tests/control-plane/kcp/start-sharded.sh` with the flags of kcp's own sharded e2e setup.
//!
//! Workspaces, exports and bindings are made through the front-proxy ([`ShardedKcp::front`]),
//! which kcp schedules onto shards; lazyquota runs once per shard, with that shard's URL and its
//! admin ([`ShardedKcp::shards`]). Attached (`LAZYQUOTA_KCP_SHARDED_DIR` /
//! `LAZYQUOTA_KCP_SHARDED_DIR_QUOTA`) or started on first use under
//! `<repo>/.lazyquota/testenv-kcp-sharded-<flavour>`, like the single shard.

use std::{collections::BTreeMap, path::PathBuf, sync::OnceLock};

use super::{KcpFlavor, KcpShard, ready};
use crate::{Error, lock_state, read_facts, start::run_script};

/// A running sharded kcp.
#[derive(Debug)]
pub struct ShardedKcp {
    dir: PathBuf,
    front: KcpShard,
    shards: Vec<KcpShard>,
}

static OWN_QUOTA: OnceLock<Result<ShardedKcp, String>> = OnceLock::new();
static LAZYQUOTA_ONLY: OnceLock<Result<ShardedKcp, String>> = OnceLock::new();

impl ShardedKcp {
    /// The sharded kcp of `flavor` (kcp's quota controller on or off on every shard): attached
    /// if its environment variable names one, else the shared one of this checkout, started on
    /// first use.
    ///
    /// # Panics
    /// With the start script's error when none can be had.
    pub fn get(flavor: KcpFlavor) -> &'static ShardedKcp {
        let cell = match flavor {
            KcpFlavor::OwnQuota => &OWN_QUOTA,
            KcpFlavor::LazyquotaOnly => &LAZYQUOTA_ONLY,
        };
        match cell.get_or_init(|| attach_or_start(flavor).map_err(|e| e.to_string())) {
            Ok(kcp) => kcp,
            Err(message) => panic!("no {flavor:?} sharded kcp for the integration tests: {message}"),
        }
    }

    /// The front-proxy, as kcp-admin (contexts `root` and `base`): what users talk to. Its
    /// [`KcpShard::user_client`], [`KcpShard::create_workspace_on`], [`KcpShard::export`] and
    /// [`KcpShard::bind`] work across shards; its shard-admin calls do not (there is none).
    pub fn front(&self) -> &KcpShard {
        &self.front
    }

    /// The shards, the root shard first, each with its URL and its shard admin (context
    /// `shard-base`, `system:masters`): what one lazyquota per shard runs with.
    pub fn shards(&self) -> &[KcpShard] {
        &self.shards
    }

    /// The shard named `name` (`root`, `shard-1`, ...).
    ///
    /// # Panics
    /// When there is no shard of that name.
    pub fn shard(&self, name: &str) -> &KcpShard {
        self.shards
            .iter()
            .find(|s| s.name() == name)
            .unwrap_or_else(|| panic!("no shard {name}"))
    }

    /// Restarts shard `name` with its data and port (`restart-shard.sh`), returning once it
    /// serves again. Its [`KcpShard::pid`] names the old process afterwards.
    pub fn restart(&self, name: &str) -> Result<(), Error> {
        run_script(
            "tests/control-plane/kcp/restart-shard.sh",
            &[self.dir.as_os_str(), name.as_ref()],
            &[],
        )
    }
}

fn from_facts(
    flavor: KcpFlavor,
    dir: PathBuf,
    facts: &BTreeMap<String, String>,
) -> Result<ShardedKcp, Error> {
    let fact = |key: &str| {
        facts
            .get(key)
            .cloned()
            .ok_or(Error::Missing("a fact of the sharded kcp's env file"))
    };
    let front = KcpShard {
        flavor,
        facts: BTreeMap::from([
            ("LAZYQUOTA_KCP_URL".to_owned(), fact("LAZYQUOTA_KCP_URL")?),
            (
                "LAZYQUOTA_KCP_KUBECONFIG".to_owned(),
                fact("LAZYQUOTA_KCP_KUBECONFIG")?,
            ),
            (
                "LAZYQUOTA_KCP_PID".to_owned(),
                fact("LAZYQUOTA_KCP_FRONT_PROXY_PID")?,
            ),
        ]),
    };
    let count: usize = fact("LAZYQUOTA_KCP_SHARDS")?
        .parse()
        .map_err(|_| Error::Missing("a shard count in the sharded kcp's env file"))?;
    let mut shards = Vec::with_capacity(count);
    for n in 0..count {
        let of = |what: &str| fact(&format!("LAZYQUOTA_KCP_SHARD_{n}_{what}"));
        shards.push(KcpShard {
            flavor,
            facts: BTreeMap::from([
                ("LAZYQUOTA_KCP_SHARD_NAME".to_owned(), of("NAME")?),
                ("LAZYQUOTA_KCP_URL".to_owned(), of("URL")?),
                ("LAZYQUOTA_KCP_KUBECONFIG".to_owned(), of("KUBECONFIG")?),
                ("LAZYQUOTA_KCP_PID".to_owned(), of("PID")?),
            ]),
        });
    }
    Ok(ShardedKcp { dir, front, shards })
}

fn attach_or_start(flavor: KcpFlavor) -> Result<ShardedKcp, Error> {
    let (variable, name) = match flavor {
        KcpFlavor::OwnQuota => ("LAZYQUOTA_KCP_SHARDED_DIR_QUOTA", "testenv-kcp-sharded-quota"),
        KcpFlavor::LazyquotaOnly => ("LAZYQUOTA_KCP_SHARDED_DIR", "testenv-kcp-sharded-lazyquota-only"),
    };
    if let Some(dir) = std::env::var_os(variable) {
        let dir = PathBuf::from(dir);
        let facts = read_facts(&dir.join("env"))?;
        return from_facts(flavor, dir, &facts);
    }
    let (dir, _lock) = lock_state(name)?;
    if let Ok(facts) = read_facts(&dir.join("env"))
        && let Ok(kcp) = from_facts(flavor, dir.clone(), &facts)
        && ready(kcp.front.url())
        && kcp.shards.iter().all(|s| ready(s.url()))
    {
        return Ok(kcp);
    }
    run_script(
        "tests/control-plane/kcp/start-sharded.sh",
        &[],
        &[
            ("LAZYQUOTA_KCP_DIR", dir.as_os_str()),
            ("LAZYQUOTA_KCP_QUOTA", flavor.quota().as_ref()),
        ],
    )?;
    let facts = read_facts(&dir.join("env"))?;
    from_facts(flavor, dir, &facts)
}
