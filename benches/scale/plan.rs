//! What a run is: the controllers compared, the arguments, and what one measurement reads.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Controller {
    Kcm,
    /// KCM with every controller it enables by default (`--controllers '*'`): the resource
    /// quota controller shares its metadata informers with the garbage collector there.
    KcmAll,
    /// The same KCM without its resource quota controller (`'*,-resourcequota-controller'`).
    KcmAllButQuota,
    Eager,
    /// Lazy mode with the default transport (HTTP/2).
    Lazy,
    /// Lazy mode over HTTP/1.1 (`--transport http1`: a connection per watch).
    LazyHttp1,
    /// Lazy mode with another build of the binary (`--lazy-binary LABEL=PATH`): a release
    /// profile variant, compared in the same run. Label and path leak once per flag.
    LazyBinary(&'static str, &'static str),
}

impl Controller {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Kcm => "KCM (resourcequota only)",
            Self::KcmAll => "KCM (every default controller)",
            Self::KcmAllButQuota => "KCM (every default controller but resourcequota)",
            Self::Eager => "lazyquota --mode eager",
            Self::Lazy => "lazyquota --mode lazy",
            Self::LazyHttp1 => "lazyquota --mode lazy --transport http1",
            Self::LazyBinary(label, _) => label,
        }
    }

    /// KCM's `--controllers` for a KCM configuration.
    pub(crate) fn kcm_controllers(self) -> Option<&'static str> {
        match self {
            Self::Kcm => Some("resourcequota-controller"),
            Self::KcmAll => Some("*"),
            Self::KcmAllButQuota => Some("*,-resourcequota-controller"),
            _ => None,
        }
    }
}

pub(crate) struct Args {
    pub(crate) crds: Vec<usize>,
    pub(crate) namespaces: usize,
    pub(crate) pods: usize,
    pub(crate) services: usize,
    pub(crate) pvcs: usize,
    pub(crate) objects_per_crd: usize,
    pub(crate) constrained: usize,
    pub(crate) new_quota_samples: usize,
    /// Extra objects of each CRD used for the new-quota samples, in that sample's namespace.
    pub(crate) new_crd_objects: usize,
    pub(crate) deletes: usize,
    /// `--second-quota-gap-ms`: the pause before each second-quota sample. A tenant adds a
    /// quota alone; back to back, each sample's consistent list would wait for the apiserver's
    /// next progress request to etcd (at most one per 100 ms per type), which the previous
    /// sample's list has just used. 0 measures that case.
    pub(crate) second_quota_gap: Duration,
    pub(crate) settle: Duration,
    pub(crate) out: PathBuf,
    pub(crate) controllers: Vec<Controller>,
    /// `--full-kcm`: the comparison against a KCM running every default controller
    /// (benches/scale/full_kcm.rs) instead of the per-controller run.
    pub(crate) full_kcm: bool,
    /// How many times each full-KCM configuration is measured at each N (interleaved).
    pub(crate) repeats: usize,
    /// `--quick`: the bounded run (CI).
    pub(crate) quick: bool,
}

impl Args {
    pub(crate) fn parse() -> Self {
        let mut a = Self {
            crds: vec![0, 100, 400],
            namespaces: 10,
            pods: 2000,
            services: 500,
            pvcs: 500,
            objects_per_crd: 20,
            constrained: 5,
            new_quota_samples: 50,
            new_crd_objects: 0,
            deletes: 200,
            second_quota_gap: Duration::from_millis(250),
            settle: Duration::from_secs(10),
            out: Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results"),
            controllers: vec![Controller::Kcm, Controller::Eager, Controller::Lazy],
            full_kcm: false,
            repeats: 3,
            quick: false,
        };
        let mut crds_given = false;
        let mut quick = false;
        let mut out_given = false;
        let mut it = std::env::args().skip(1);
        let mut extra = Vec::new();
        while let Some(flag) = it.next() {
            let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
            let num = |v: String| v.parse::<usize>().unwrap_or_else(|_| panic!("not a number: {v}"));
            match flag.as_str() {
                "--full-kcm" => a.full_kcm = true,
                "--repeats" => a.repeats = num(value()).max(1),
                "--quick" => {
                    quick = true;
                    // Two points: CI's bounded run checks that everything runs (room for
                    // kcp's e2e quota suite), the full run measures the slope.
                    a.crds = vec![0, 20];
                    a.pods = 200;
                    a.services = 50;
                    a.pvcs = 50;
                    a.objects_per_crd = 10;
                    a.new_quota_samples = 10;
                    a.deletes = 20;
                    a.settle = Duration::from_secs(2);
                    a.out = std::env::temp_dir().join("lazyquota-bench-quick");
                }
                "--crds" => {
                    crds_given = true;
                    a.crds = value().split(',').map(|v| num(v.to_owned())).collect();
                }
                "--pods" => a.pods = num(value()),
                "--services" => a.services = num(value()),
                "--pvcs" => a.pvcs = num(value()),
                "--objects-per-crd" => a.objects_per_crd = num(value()),
                "--new-quota-samples" => a.new_quota_samples = num(value()),
                "--new-crd-objects" => a.new_crd_objects = num(value()),
                "--deletes" => a.deletes = num(value()),
                "--second-quota-gap-ms" => a.second_quota_gap = Duration::from_millis(num(value()) as u64),
                "--settle" => a.settle = Duration::from_secs(num(value()) as u64),
                "--out" => {
                    out_given = true;
                    a.out = PathBuf::from(value());
                }
                "--constrained" => a.constrained = num(value()),
                "--controllers" => {
                    a.controllers = value()
                        .split(',')
                        .map(|c| match c {
                            "kcm" => Controller::Kcm,
                            "eager" => Controller::Eager,
                            "lazy" => Controller::Lazy,
                            "lazy-h1" => Controller::LazyHttp1,
                            other => panic!("unknown controller {other} (kcm, eager, lazy, lazy-h1)"),
                        })
                        .collect();
                }
                "--lazy-binary" => {
                    let value = value();
                    let (label, path) = value
                        .split_once('=')
                        .unwrap_or_else(|| panic!("--lazy-binary LABEL=PATH, got {value}"));
                    assert!(Path::new(path).is_file(), "--lazy-binary: no binary at {path}");
                    let label = format!("lazyquota --mode lazy ({label})");
                    extra.push(Controller::LazyBinary(
                        Box::leak(label.into_boxed_str()),
                        Box::leak(path.to_owned().into_boxed_str()),
                    ));
                }
                "--bench" => {} // cargo bench passes this
                other => panic!("unknown flag {other}"),
            }
        }
        a.controllers.extend(extra);
        a.quick = quick;
        if a.full_kcm {
            // Where the saving changes sign lies between these (the break-even N).
            if !crds_given && !quick {
                a.crds = vec![0, 100, 200, 400];
            }
            if !out_given {
                a.out.push("full-kcm");
            }
            if quick {
                // One point: CI's bounded run checks that it runs.
                a.repeats = 1;
                if !crds_given {
                    a.crds = vec![20];
                }
            }
        }
        a.crds.sort_unstable();
        a
    }
}

impl Args {
    /// A result file's first sentences: the command, the machine, the data.
    pub(crate) fn generated_by(&self) -> String {
        format!(
            "Generated by `cargo bench --bench scale -- {}` on {} CPU cores. Data: {} pods, {} services, {} PVCs \
             over {} namespaces; N namespaced CRDs with {} objects each; quotas constrain pods, services, PVCs and \
             K = {} CRDs. Second-quota samples {} ms apart.",
            crate::common::arguments(),
            crate::common::cores(),
            self.pods,
            self.services,
            self.pvcs,
            self.namespaces,
            self.objects_per_crd,
            self.constrained,
            self.second_quota_gap.as_millis(),
        )
    }
}

/// One controller's figures at one N.
#[derive(Clone, Debug, Default)]
pub(crate) struct Sample {
    pub(crate) tasks: f64,
    pub(crate) heap_bytes: f64,
    pub(crate) rss_bytes: f64,
    pub(crate) anon_bytes: f64,
    pub(crate) connections: f64,
    pub(crate) apiserver_watches: f64,
    pub(crate) first_sync: Duration,
    /// CPU seconds the controller used from its start until every quota was synced.
    pub(crate) sync_cpu: f64,
    /// CPU seconds kube-apiserver used meanwhile.
    pub(crate) sync_apiserver_cpu: f64,
    /// Bytes the controller had received from kube-apiserver when it was read (after the
    /// first sync and the settling time), over the connections it holds.
    pub(crate) received_bytes: f64,
    pub(crate) new_quota: Vec<Duration>,
    /// A `requests.cpu` quota beside the namespace's `compute` quota (pods watched, quiet).
    pub(crate) typed_quota: Vec<Duration>,
    /// A `requests.memory` and `limits.memory` quota beside it.
    pub(crate) memory_quota: Vec<Duration>,
    /// A `requests.cpu` quota scoped NotTerminating beside it.
    pub(crate) scoped_quota: Vec<Duration>,
    pub(crate) delete: Vec<Duration>,
}

pub(crate) type Results = BTreeMap<(usize, &'static str), Sample>;
