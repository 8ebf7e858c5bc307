//! One line per step for a seed's trace.

use super::*;

pub fn describe(item: &Item) -> String {
    match item {
        Item::Init => "Init".into(),
        Item::InitApply(o) => format!("InitApply {}/{}", o.namespace, o.name),
        Item::InitDone => "InitDone".into(),
        Item::Apply(o) => format!("Apply {}/{}", o.namespace, o.name),
        Item::Delete(o) => format!("Delete {}/{}", o.namespace, o.name),
        Item::Failed(reason, _) => format!("Failed {reason}"),
    }
}

pub fn quota_summary(q: &k8s_openapi::api::core::v1::ResourceQuota) -> String {
    let used: Vec<String> = q
        .status
        .as_ref()
        .and_then(|s| s.used.as_ref())
        .map(|u| u.iter().map(|(k, v)| format!("{k}={}", v.0)).collect())
        .unwrap_or_default();
    format!(
        "{}/{} rv {} used [{}]",
        q.metadata.namespace.as_deref().unwrap_or_default(),
        q.metadata.name.as_deref().unwrap_or_default(),
        q.metadata.resource_version.as_deref().unwrap_or_default(),
        used.join(" ")
    )
}

pub fn describe_quota(event: &QuotaEvent) -> String {
    match event {
        QuotaEvent::RelistStarted => "RelistStarted".into(),
        QuotaEvent::Relisted(q) => format!("Relisted {}", quota_summary(q)),
        QuotaEvent::RelistDone => "RelistDone".into(),
        QuotaEvent::Applied(q) => format!("Applied {}", quota_summary(q)),
        QuotaEvent::Deleted(q) => format!("Deleted {}", quota_summary(q)),
    }
}

pub fn describe_input(input: &Input) -> String {
    match input {
        Input::Written {
            key,
            precondition,
            result,
        } => match result {
            Ok(q) => format!("write {key} on {precondition:?}: ok {}", quota_summary(q)),
            Err(f) => format!("write {key} on {precondition:?}: {:?} {}", f.code, f.message),
        },
        Input::Read { key, result } => match result {
            Ok(q) => format!("read {key}: {}", quota_summary(q)),
            Err(f) => format!("read {key}: {:?}", f.code),
        },
        Input::Discovered { cluster, result } => format!(
            "discovery {cluster}: {}",
            if result.is_ok() { "ok" } else { "error" }
        ),
        Input::Filled {
            key,
            namespace,
            listed,
        } => {
            format!(
                "fill {key} {namespace}: {}",
                listed
                    .as_ref()
                    .map_or_else(Clone::clone, |l| format!("{} objects", l.len()))
            )
        }
        other => format!("{other:?}"),
    }
}

pub fn describe_effect(effect: &Effect) -> String {
    match effect {
        Effect::WriteStatus(w) => {
            let used: Vec<String> = w.used.iter().map(|(k, v)| format!("{k}={}", v.0)).collect();
            format!(
                "write {} on {:?} used [{}] lowers {:?}",
                w.key,
                w.precondition,
                used.join(" "),
                w.lowers
            )
        }
        Effect::OpenWatch { id, key, .. } => format!("open watch {id} {key}"),
        Effect::CloseWatch { id } => format!("close watch {id}"),
        Effect::Event { quota, reason, .. } => format!("event {quota} {reason}"),
        other => format!("{other:?}"),
    }
}
