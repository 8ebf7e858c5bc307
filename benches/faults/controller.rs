//! The quota controller under test, as a Deployment would run it: one or two replicas (two
//! with leader election), each a child process with its own metrics port and log, killed and
//! started again by the harness.

use std::{
    fmt,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::Duration,
};

use kube::Client;

use crate::common::{self, controllers, readings::metric};

/// Which controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Who {
    /// kube-controller-manager running only `resourcequota-controller`.
    Kcm,
    /// lazyquota (KCM's quota controller off).
    Lazy,
}

impl Who {
    pub(crate) fn parse(name: &str) -> Option<Self> {
        match name {
            "kcm" => Some(Self::Kcm),
            "lazy" | "lazyquota" => Some(Self::Lazy),
            _ => None,
        }
    }

    /// Its leader gauge (1 on the replica that leads).
    fn leader_metric(self) -> &'static str {
        match self {
            Self::Kcm => "leader_election_master_status",
            Self::Lazy => "lazyquota_leader",
        }
    }
}

impl fmt::Display for Who {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Kcm => "KCM",
            Self::Lazy => "lazyquota",
        })
    }
}

struct Replica {
    child: Child,
    port: u16,
    log: PathBuf,
}

/// The running replicas of one controller.
pub(crate) struct Deployment {
    who: Who,
    state: PathBuf,
    kubeconfig: PathBuf,
    leader_elect: bool,
    /// kube-apiserver's `--request-timeout`, given to lazyquota.
    request_timeout: Duration,
    /// `None`: a replica removed for good (its pod gone).
    replicas: Vec<Option<Replica>>,
    /// Replicas the harness started again after they exited on their own.
    pub(crate) restarts: u64,
}

impl Drop for Deployment {
    /// A failed run must not leave a controller running.
    fn drop(&mut self) {
        for replica in self.replicas.iter_mut().flatten() {
            common::stop_child(&mut replica.child);
        }
    }
}

impl Deployment {
    /// Starts one replica of `who` against `kubeconfig` (by default the control plane's
    /// `kcm.kubeconfig` for KCM, `admin.kubeconfig` for lazyquota).
    pub(crate) fn start(
        who: Who,
        state: &Path,
        kubeconfig: Option<&Path>,
        leader_elect: bool,
        request_timeout: Duration,
    ) -> Self {
        let kubeconfig = kubeconfig.map_or_else(
            || match who {
                Who::Kcm => state.join("kcm.kubeconfig"),
                Who::Lazy => state.join("admin.kubeconfig"),
            },
            Path::to_path_buf,
        );
        let mut deployment = Self {
            who,
            state: state.to_owned(),
            kubeconfig,
            leader_elect,
            request_timeout,
            replicas: Vec::new(),
            restarts: 0,
        };
        deployment.add_replica();
        deployment
    }

    /// Starts one more replica (a new pod: a name of its own).
    pub(crate) fn add_replica(&mut self) {
        let replica = self.spawn(self.replicas.len());
        self.replicas.push(Some(replica));
    }

    fn spawn(&self, index: usize) -> Replica {
        let port = common::free_port();
        let log = self
            .state
            .join(format!("logs/faults-{}-{index}.log", self.who).to_lowercase());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log");
        let mut command = match self.who {
            Who::Kcm => {
                let mut c =
                    controllers::kcm_command(&self.state, &self.kubeconfig, port, "resourcequota-controller");
                if self.leader_elect {
                    // Later flags win: KCM's defaults (15 s lease, 10 s renew deadline, 2 s retry).
                    c.arg("--leader-elect=true");
                }
                c
            }
            Who::Lazy => {
                let mut c =
                    controllers::lazyquota_command(&common::lazyquota_binary(), &self.kubeconfig, port);
                // The apiserver's request timeout: how long a charge no object paid is held.
                c.args([
                    "--apiserver-request-timeout",
                    &format!("{}s", self.request_timeout.as_secs()),
                ]);
                if self.leader_elect {
                    // The same defaults as KCM's.
                    c.args([
                        "--leader-elect",
                        "--leader-election-identity",
                        &format!("replica-{index}"),
                    ]);
                }
                c
            }
        };
        let child = command
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("the controller under test");
        Replica { child, port, log }
    }

    /// SIGKILL to replica `index` (no chance to release a Lease or finish a write); started
    /// again by [`Self::start_again`], or gone for good with `remove` (its pod deleted).
    pub(crate) fn kill(&mut self, index: usize, remove: bool) {
        if let Some(replica) = self.replicas[index].as_mut() {
            let _ = replica.child.kill();
            let _ = replica.child.wait();
        }
        if remove {
            self.replicas[index] = None;
        }
    }

    /// Starts replica `index` again (after [`Self::kill`]).
    pub(crate) fn start_again(&mut self, index: usize) {
        self.replicas[index] = Some(self.spawn(index));
    }

    /// Starts every replica that exited on its own again, as a Deployment's kubelet would;
    /// returns how many.
    pub(crate) fn keep_running(&mut self) -> u64 {
        let mut started = 0;
        for index in 0..self.replicas.len() {
            let exited = self.replicas[index]
                .as_mut()
                .is_some_and(|r| r.child.try_wait().ok().flatten().is_some());
            if exited {
                self.start_again(index);
                started += 1;
            }
        }
        self.restarts += started;
        started
    }

    /// The replica that leads now (its leader gauge is 1), if one does.
    pub(crate) async fn leader(&self) -> Option<usize> {
        for index in 0..self.replicas.len() {
            if metric(&self.metrics_of(index).await, self.who.leader_metric()) >= 1.0 {
                return Some(index);
            }
        }
        None
    }

    /// Replica `index`'s `/metrics` text (empty when it does not answer).
    pub(crate) async fn metrics_of(&self, index: usize) -> String {
        let Some(replica) = &self.replicas[index] else {
            return String::new();
        };
        let scheme = match self.who {
            Who::Kcm => "https",
            Who::Lazy => "http",
        };
        let url = format!("{scheme}://127.0.0.1:{}", replica.port);
        let mut config = kube::Config::new(url.parse().expect("url"));
        // KCM serves a self-signed certificate; loopback only.
        config.accept_invalid_certs = true;
        config.read_timeout = Some(Duration::from_secs(5));
        let Ok(client) = Client::try_from(config) else {
            return String::new();
        };
        let request = http::Request::get("/metrics").body(Vec::new()).expect("request");
        client.request_text(request).await.unwrap_or_default()
    }

    /// Every replica's `/metrics`, one after another.
    pub(crate) async fn metrics(&self) -> String {
        let mut all = String::new();
        for index in 0..self.replicas.len() {
            all.push_str(&self.metrics_of(index).await);
        }
        all
    }

    /// Every replica's log so far.
    pub(crate) fn logs(&self) -> String {
        self.replicas
            .iter()
            .flatten()
            .map(|r| std::fs::read_to_string(&r.log).unwrap_or_default())
            .collect()
    }
}
