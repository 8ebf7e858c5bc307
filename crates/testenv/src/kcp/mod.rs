//! A real kcp shard for the integration tests: kcp v0.32.3 built from source by
//! `tests/control-plane/kcp/build.sh` and started on loopback, with its embedded etcd, by
//! `tests/control-plane/kcp/start.sh`.
//!
//! Two flavours, because two controllers must never write the same quota status:
//! [`KcpFlavor::OwnQuota`] runs kcp's own quota controller (the reference lazyquota is compared
//! with), [`KcpFlavor::LazyquotaOnly`] runs every other kcp controller, so lazyquota is the only
//! writer. kcp's quota admission plugin runs in both.
//!
//! Like the Kubernetes control planes, a shard is attached (`LAZYQUOTA_KCP_DIR` /
//! `LAZYQUOTA_KCP_DIR_QUOTA` name the state directory of one started by start.sh) or started on
//! first use under `<repo>/.lazyquota/testenv-kcp-<flavour>` (file lock, shared by every test
//! binary; `make test` stops it at the end). [`sharded`] has kcp as the seed ran it: a root
//! shard and more, a cache server and a front-proxy.

pub mod sharded;

use std::{collections::BTreeMap, path::PathBuf, process::Command, sync::OnceLock, time::Duration};

use kube::{
    Api, Client, Config,
    api::{ApiResource, DynamicObject, PostParams},
};

use crate::{Error, context_config, eventually, lock_state, read_facts, start::run_script};

/// The annotation kcp puts on every object it returns: its logical cluster's name.
pub const CLUSTER_ANNOTATION: &str = "kcp.io/cluster";

/// Which controllers write ResourceQuota status on a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KcpFlavor {
    /// kcp runs its own quota controller (kcp-kube-quota).
    OwnQuota,
    /// kcp runs every controller but its quota controller: lazyquota is the only writer.
    LazyquotaOnly,
}

impl KcpFlavor {
    fn env_var(self) -> &'static str {
        match self {
            Self::OwnQuota => "LAZYQUOTA_KCP_DIR_QUOTA",
            Self::LazyquotaOnly => "LAZYQUOTA_KCP_DIR",
        }
    }

    fn dir_name(self) -> &'static str {
        match self {
            Self::OwnQuota => "testenv-kcp-quota",
            Self::LazyquotaOnly => "testenv-kcp-lazyquota-only",
        }
    }

    fn quota(self) -> &'static str {
        match self {
            Self::OwnQuota => "on",
            Self::LazyquotaOnly => "off",
        }
    }
}

/// A running kcp shard.
#[derive(Debug)]
pub struct KcpShard {
    flavor: KcpFlavor,
    facts: BTreeMap<String, String>,
}

static OWN_QUOTA: OnceLock<Result<KcpShard, String>> = OnceLock::new();
static LAZYQUOTA_ONLY: OnceLock<Result<KcpShard, String>> = OnceLock::new();

/// A workspace the tests made: its path (`root:<name>`) and its logical cluster's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    /// The canonical path, e.g. `root:lq-c1-1a2b`.
    pub path: String,
    /// The logical cluster's name (`spec.cluster`), what `kcp.io/cluster` annotations carry.
    pub cluster: String,
}

impl KcpShard {
    /// The shard of `flavor`: attached if its environment variable names one, else the shared
    /// one of this checkout, started on first use.
    ///
    /// # Panics
    /// With the start script's error when no shard can be had.
    pub fn get(flavor: KcpFlavor) -> &'static KcpShard {
        let cell = match flavor {
            KcpFlavor::OwnQuota => &OWN_QUOTA,
            KcpFlavor::LazyquotaOnly => &LAZYQUOTA_ONLY,
        };
        match cell.get_or_init(|| attach_or_start(flavor).map_err(|e| e.to_string())) {
            Ok(shard) => shard,
            Err(message) => panic!("no {flavor:?} kcp shard for the integration tests: {message}"),
        }
    }

    /// Which controllers write quota status here.
    pub fn flavor(&self) -> KcpFlavor {
        self.flavor
    }

    /// The shard's base URL (`https://127.0.0.1:<port>`).
    pub fn url(&self) -> &str {
        self.facts.get("LAZYQUOTA_KCP_URL").map_or("", String::as_str)
    }

    /// kcp's admin kubeconfig (contexts `root`, `base`, `shard-base`, `system:admin`).
    pub fn kubeconfig(&self) -> PathBuf {
        PathBuf::from(
            self.facts
                .get("LAZYQUOTA_KCP_KUBECONFIG")
                .map_or("", String::as_str),
        )
    }

    /// The shard's name in a sharded kcp (`root`, `shard-1`, ...); empty for the single shard
    /// and the front-proxy.
    pub fn name(&self) -> &str {
        self.facts
            .get("LAZYQUOTA_KCP_SHARD_NAME")
            .map_or("", String::as_str)
    }

    /// The kcp process id (for its RSS and threads in /proc).
    pub fn pid(&self) -> Option<u32> {
        self.facts.get("LAZYQUOTA_KCP_PID")?.parse().ok()
    }

    /// A client configuration of `context` in the admin kubeconfig.
    pub async fn config(&self, context: &str) -> Result<Config, Error> {
        context_config(&self.kubeconfig(), context).await
    }

    /// A shard-admin client (`system:masters`, context `shard-base`) for `/clusters/<cluster>`
    /// — a workspace path, a logical cluster name, or `*` for wildcard lists and watches.
    pub async fn client(&self, cluster: &str) -> Result<Client, Error> {
        self.client_as("shard-base", cluster).await
    }

    /// A kcp-admin client (context `base`) for `/clusters/<cluster>`: what a workspace owner
    /// uses. Workspaces must be created this way: kcp records their creator, and one created
    /// by the shard admin (who is no kcp user) never leaves `Initializing` ("no createdBy").
    pub async fn user_client(&self, cluster: &str) -> Result<Client, Error> {
        self.client_as("base", cluster).await
    }

    async fn client_as(&self, context: &str, cluster: &str) -> Result<Client, Error> {
        let mut config = self.config(context).await?;
        let base = config.cluster_url.to_string();
        let base = base
            .split("/clusters/")
            .next()
            .unwrap_or(&base)
            .trim_end_matches('/');
        config.cluster_url = format!("{base}/clusters/{cluster}")
            .parse()
            .map_err(|_| Error::Missing("a valid shard URL"))?;
        Client::try_from(config).map_err(|source| Error::Kube {
            what: format!("building a client for /clusters/{cluster}"),
            source,
        })
    }

    /// A kubeconfig for lazyquota: the admin kubeconfig with `shard-base` as its current
    /// context (wildcard requests need the shard admin), written to `path`.
    pub fn shard_kubeconfig(&self, path: &std::path::Path) -> Result<(), Error> {
        write_shard_kubeconfig(&self.kubeconfig(), path)
    }

    /// The shard's `/metrics` text (kcp's own: Go runtime, process, apiserver metrics; served at
    /// the shard's root, not under `/clusters`).
    ///
    /// # Panics
    /// Never in practice: the request built is a constant, valid GET.
    pub async fn metrics(&self) -> Result<String, Error> {
        let mut config = self.config("shard-base").await?;
        let base = config.cluster_url.to_string();
        config.cluster_url = base
            .split("/clusters/")
            .next()
            .unwrap_or(&base)
            .parse()
            .map_err(|_| Error::Missing("a valid shard URL"))?;
        let root = Client::try_from(config).map_err(|source| Error::Kube {
            what: "building the shard client".into(),
            source,
        })?;
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .expect("a GET request without a body is valid");
        root.request_text(request).await.map_err(|source| Error::Kube {
            what: "GET /metrics".into(),
            source,
        })
    }

    /// Creates workspace `name` under `parent` (a path such as `root`) and returns once it is
    /// Ready, with its logical cluster's name.
    pub async fn create_workspace(&self, parent: &str, name: &str) -> Result<Workspace, Error> {
        self.create_workspace_on(parent, name, None).await
    }

    /// [`KcpShard::create_workspace`], placed on the shard named `shard` when one is given
    /// (`spec.location.selector` on the `name` label kcp gives each Shard): through a sharded
    /// kcp's front-proxy, kcp's workspace scheduler puts it there.
    ///
    /// # Panics
    /// Never in practice: the Workspace object built is constant but for its names.
    pub async fn create_workspace_on(
        &self,
        parent: &str,
        name: &str,
        shard: Option<&str>,
    ) -> Result<Workspace, Error> {
        let api = Api::<DynamicObject>::all_with(self.user_client(parent).await?, &workspace_resource());
        let mut object = serde_json::json!({
            "apiVersion": "tenancy.kcp.io/v1alpha1",
            "kind": "Workspace",
            "metadata": {"name": name},
        });
        if let Some(shard) = shard {
            object["spec"] = serde_json::json!({"location": {"selector": {"matchLabels": {"name": shard}}}});
        }
        let object: DynamicObject = serde_json::from_value(object).expect("a valid Workspace");
        api.create(&PostParams::default(), &object)
            .await
            .map_err(|source| Error::Kube {
                what: format!("creating workspace {parent}:{name}"),
                source,
            })?;
        let ready = eventually(Duration::from_secs(90), || async {
            let ws = api.get(name).await.ok()?;
            let phase = ws.data["status"]["phase"].as_str()?;
            let cluster = ws.data["spec"]["cluster"].as_str()?;
            (phase == "Ready").then(|| cluster.to_owned())
        })
        .await
        .ok_or(Error::Missing("a Ready workspace within 90 s"))?;
        // The logical cluster answers requests a moment after the workspace says Ready.
        let path = format!("{parent}:{name}");
        let client = self.user_client(&path).await?;
        let served = eventually(Duration::from_secs(30), || async {
            client.apiserver_version().await.ok().map(|_| ())
        })
        .await;
        served.ok_or(Error::Missing("the new workspace serving requests within 30 s"))?;
        Ok(Workspace { path, cluster: ready })
    }
}

/// A namespaced type served through an APIExport: schema `<version>.<plural>.<group>` (that one
/// version, schemaless), export named `<plural>` (a workspace binds a group/resource once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportedType {
    /// The API group, e.g. `example.io`.
    pub group: String,
    /// The plural resource name, e.g. `widgets`.
    pub plural: String,
    /// The kind, e.g. `Widget`.
    pub kind: String,
    /// The one version the schema serves, e.g. `v1`.
    pub version: String,
}

impl ExportedType {
    /// `<plural>.<group>` at `version`, kind from the plural (`widgets` → `Widget`).
    pub fn new(group: &str, plural: &str, version: &str) -> Self {
        let singular = plural.strip_suffix('s').unwrap_or(plural);
        let mut kind: Vec<char> = singular.chars().collect();
        if let Some(first) = kind.first_mut() {
            *first = first.to_ascii_uppercase();
        }
        Self {
            group: group.into(),
            plural: plural.into(),
            kind: kind.into_iter().collect(),
            version: version.into(),
        }
    }

    /// The objects' `apiVersion`: `<group>/<version>`, or the version alone for the core group
    /// (a core type such as Services can be bound through an APIBinding too).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The resource, for dynamic clients.
    pub fn resource(&self) -> ApiResource {
        ApiResource {
            group: self.group.clone(),
            version: self.version.clone(),
            api_version: self.api_version(),
            kind: self.kind.clone(),
            plural: self.plural.clone(),
        }
    }

    /// The quota key counting it: `count/<plural>.<group>` (`count/<plural>` in the core group).
    pub fn count_key(&self) -> String {
        if self.group.is_empty() {
            format!("count/{}", self.plural)
        } else {
            format!("count/{}.{}", self.plural, self.group)
        }
    }
}

fn apis_resource(version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "apis.kcp.io".into(),
        version: version.into(),
        api_version: format!("apis.kcp.io/{version}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

async fn create(api: &Api<DynamicObject>, object: serde_json::Value, what: &str) -> Result<(), Error> {
    let object: DynamicObject = serde_json::from_value(object).expect("a valid object");
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(source) => Err(Error::Kube {
            what: what.into(),
            source,
        }),
    }
}

/// Creates the APIResourceSchema of `ty` in `provider`, serving `versions` and storing the last
/// (conversion `None` when there are several), named `<last version>.<plural>.<group>`; returns
/// its name. Schemas are immutable: a new one is how an export changes.
async fn create_schema(
    client: &Client,
    provider: &str,
    ty: &ExportedType,
    versions: &[&str],
) -> Result<String, Error> {
    let storage = versions.last().copied().unwrap_or(&ty.version);
    // The core group is named `core` in schema names, as kcp names it.
    let group = if ty.group.is_empty() { "core" } else { &ty.group };
    let schema_name = format!("{storage}.{}.{group}", ty.plural);
    let schemas = Api::<DynamicObject>::all_with(
        client.clone(),
        &apis_resource("v1alpha1", "APIResourceSchema", "apiresourceschemas"),
    );
    let versions: Vec<serde_json::Value> = versions
        .iter()
        .map(|v| {
            serde_json::json!({"name": v, "served": true, "storage": *v == storage,
                "schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}})
        })
        .collect();
    let mut spec = serde_json::json!({
        "group": ty.group, "scope": "Namespaced",
        "names": {"kind": ty.kind, "listKind": format!("{}List", ty.kind),
                  "plural": ty.plural, "singular": ty.kind.to_ascii_lowercase()},
    });
    if versions.len() > 1 {
        spec["conversion"] = serde_json::json!({"strategy": "None"});
    }
    spec["versions"] = serde_json::Value::Array(versions);
    create(
        &schemas,
        serde_json::json!({
            "apiVersion": "apis.kcp.io/v1alpha1", "kind": "APIResourceSchema",
            "metadata": {"name": schema_name}, "spec": spec,
        }),
        &format!("creating APIResourceSchema {schema_name} in {provider}"),
    )
    .await?;
    Ok(schema_name)
}

impl KcpShard {
    /// Exports `ty` from the workspace at `provider` (a path): its APIResourceSchema and an
    /// APIExport (`apis.kcp.io/v1alpha2`, CRD storage) named after the plural.
    pub async fn export(&self, provider: &str, ty: &ExportedType) -> Result<(), Error> {
        let client = self.user_client(provider).await?;
        let schema_name = create_schema(&client, provider, ty, &[&ty.version]).await?;
        let exports =
            Api::<DynamicObject>::all_with(client, &apis_resource("v1alpha2", "APIExport", "apiexports"));
        create(
            &exports,
            serde_json::json!({
                "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIExport",
                "metadata": {"name": ty.plural},
                "spec": {"resources": [{"name": ty.plural, "group": ty.group, "schema": schema_name,
                                        "storage": {"crd": {}}}]}
            }),
            &format!("creating APIExport {} in {provider}", ty.plural),
        )
        .await
    }

    /// Updates the export of `ty` in `provider` to a new APIResourceSchema
    /// (`<version>.<plural>.<group>`, immutable like every schema) that serves `ty`'s version and
    /// `version`, storing `version` (conversion `None`), and returns the type at `version`. kcp
    /// moves every binding to it, on every shard.
    pub async fn update_export(
        &self,
        provider: &str,
        ty: &ExportedType,
        version: &str,
    ) -> Result<ExportedType, Error> {
        let client = self.user_client(provider).await?;
        let schema_name = create_schema(&client, provider, ty, &[&ty.version, version]).await?;
        let exports =
            Api::<DynamicObject>::all_with(client, &apis_resource("v1alpha2", "APIExport", "apiexports"));
        // A merge patch would replace the whole resources list: read, change, write back.
        let what = format!("pointing APIExport {} in {provider} at {schema_name}", ty.plural);
        let mut export = exports.get(&ty.plural).await.map_err(|source| Error::Kube {
            what: what.clone(),
            source,
        })?;
        export.data["spec"]["resources"][0]["schema"] = serde_json::Value::String(schema_name.clone());
        exports
            .replace(&ty.plural, &PostParams::default(), &export)
            .await
            .map_err(|source| Error::Kube { what, source })?;
        Ok(ExportedType {
            version: version.to_owned(),
            ..ty.clone()
        })
    }

    /// Binds the workspace at `consumer` to the export of `ty` in `provider` (APIBinding
    /// `apis.kcp.io/v1alpha2` named after the plural) and returns the bound identity hash once
    /// the binding is `Bound` and the type is served there.
    pub async fn bind(&self, consumer: &str, provider: &str, ty: &ExportedType) -> Result<String, Error> {
        let client = self.user_client(consumer).await?;
        let bindings = Api::<DynamicObject>::all_with(
            client.clone(),
            &apis_resource("v1alpha2", "APIBinding", "apibindings"),
        );
        create(
            &bindings,
            serde_json::json!({
                "apiVersion": "apis.kcp.io/v1alpha2", "kind": "APIBinding",
                "metadata": {"name": ty.plural},
                "spec": {"reference": {"export": {"path": provider, "name": ty.plural}}}
            }),
            &format!("creating APIBinding {} in {consumer}", ty.plural),
        )
        .await?;
        let identity = eventually(Duration::from_mins(1), || async {
            let binding = bindings.get(&ty.plural).await.ok()?;
            if binding.data["status"]["phase"].as_str()? != "Bound" {
                return None;
            }
            binding.data["status"]["boundResources"][0]["schema"]["identityHash"]
                .as_str()
                .map(str::to_owned)
        })
        .await
        .ok_or(Error::Missing("a Bound APIBinding within 60 s"))?;
        let objects = Api::<DynamicObject>::all_with(client, &ty.resource());
        eventually(Duration::from_secs(30), || async {
            objects
                .list(&kube::api::ListParams::default().limit(1))
                .await
                .ok()
                .map(|_| ())
        })
        .await
        .ok_or(Error::Missing("the bound type served within 30 s"))?;
        Ok(identity)
    }
}

/// Writes kcp's admin kubeconfig `admin` to `path` with `shard-base` (the shard admin, who may
/// make wildcard requests) as its current context: what lazyquota runs with on a shard.
pub fn write_shard_kubeconfig(admin: &std::path::Path, path: &std::path::Path) -> Result<(), Error> {
    let text = std::fs::read_to_string(admin).map_err(|source| Error::Read {
        path: admin.to_owned(),
        source,
    })?;
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("current-context:") {
                "current-context: shard-base"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(path, text).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })
}

/// `tenancy.kcp.io/v1alpha1` Workspace.
pub fn workspace_resource() -> ApiResource {
    ApiResource {
        group: "tenancy.kcp.io".into(),
        version: "v1alpha1".into(),
        api_version: "tenancy.kcp.io/v1alpha1".into(),
        kind: "Workspace".into(),
        plural: "workspaces".into(),
    }
}

fn attach_or_start(flavor: KcpFlavor) -> Result<KcpShard, Error> {
    if let Some(dir) = std::env::var_os(flavor.env_var()) {
        let facts = read_facts(&PathBuf::from(dir).join("env"))?;
        return Ok(KcpShard { flavor, facts });
    }
    let (dir, _lock) = lock_state(flavor.dir_name())?;
    if let Ok(facts) = read_facts(&dir.join("env"))
        && facts.get("LAZYQUOTA_KCP_URL").is_some_and(|url| ready(url))
    {
        return Ok(KcpShard { flavor, facts });
    }
    run_script(
        "tests/control-plane/kcp/start.sh",
        &[],
        &[
            ("LAZYQUOTA_KCP_DIR", dir.as_os_str()),
            ("LAZYQUOTA_KCP_QUOTA", flavor.quota().as_ref()),
        ],
    )?;
    let facts = read_facts(&dir.join("env"))?;
    Ok(KcpShard { flavor, facts })
}

/// Whether a shard started earlier still answers `/readyz` (anonymous access to it is allowed;
/// loopback test traffic, so the serving certificate is not checked here).
fn ready(url: &str) -> bool {
    Command::new("curl")
        .args(["-fsSk", "--max-time", "3"])
        .arg(format!("{url}/readyz"))
        .output()
        .is_ok_and(|o| o.status.success())
}
