//! Delegated authentication and authorization for `/metrics`, as KCM's secure port does:
//! the bearer token is checked with a TokenReview, the user it names with a
//! SubjectAccessReview for `get` on the non-resource path. Decisions are cached for a short
//! time (a scraper costs two API calls per TTL, not per scrape).
//!
//! The cache is a pure structure ([`DecisionCache`]); [`DelegatedAuth`] is the thin IO around
//! it. Tokens are never logged; the cache keeps them only as the key of a live entry.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, Client, api::PostParams};
use tracing::warn;

/// The answer for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Authenticated and authorized.
    Allowed,
    /// No token, or a token the apiserver does not accept: 401.
    Unauthenticated,
    /// A valid token whose user may not `get` the path: 403 (the user's name, for the log).
    Forbidden(String),
    /// The reviews could not be made (apiserver unreachable): 500, not cached.
    Unavailable,
}

/// Decisions by (token, path), each valid for a TTL; bounded in size.
///
/// Cost: one entry per distinct token and path seen within the TTL (Prometheus: one), about
/// the token's length plus ~100 bytes.
#[derive(Debug)]
pub struct DecisionCache {
    entries: HashMap<(String, String), (Instant, Decision)>,
    ttl: Duration,
    capacity: usize,
}

impl DecisionCache {
    /// A cache keeping decisions for `ttl`, at most `capacity` of them.
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            entries: HashMap::new(),
            ttl,
            capacity,
        }
    }

    /// The cached decision for (token, path) at `now`, if still valid.
    pub fn get(&self, token: &str, path: &str, now: Instant) -> Option<Decision> {
        let (at, decision) = self.entries.get(&(token.to_owned(), path.to_owned()))?;
        (now.saturating_duration_since(*at) < self.ttl).then(|| decision.clone())
    }

    /// Remembers a decision (never [`Decision::Unavailable`]: that is retried next time).
    pub fn put(&mut self, token: &str, path: &str, decision: Decision, now: Instant) {
        if decision == Decision::Unavailable {
            return;
        }
        if self.entries.len() >= self.capacity {
            let ttl = self.ttl;
            self.entries
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
            if self.entries.len() >= self.capacity {
                // Still full of live entries (a flood of distinct tokens): start over.
                self.entries.clear();
            }
        }
        self.entries
            .insert((token.to_owned(), path.to_owned()), (now, decision));
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// TokenReview + SubjectAccessReview against the cluster lazyquota runs in.
pub struct DelegatedAuth {
    client: Client,
    cache: Mutex<DecisionCache>,
}

impl DelegatedAuth {
    /// Checks with `client`'s apiserver; decisions are cached for 10 s (KCM caches
    /// authentication for 10 s and authorization for 10 s allowed / 10 s denied).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            cache: Mutex::new(DecisionCache::new(Duration::from_secs(10), 4096)),
        }
    }

    /// The decision for a request to `path` with this `Authorization` header value.
    pub async fn check(&self, authorization: Option<&str>, path: &str) -> Decision {
        // The scheme is case-insensitive (RFC 7235).
        let Some(token) = authorization
            .and_then(|h| h.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|t| !t.is_empty())
        else {
            return Decision::Unauthenticated;
        };
        let now = Instant::now();
        if let Some(decision) = self.cached(token, path, now) {
            return decision;
        }
        let decision = self.review(token, path).await;
        if let Ok(mut cache) = self.cache.lock() {
            cache.put(token, path, decision.clone(), now);
        }
        decision
    }

    fn cached(&self, token: &str, path: &str, now: Instant) -> Option<Decision> {
        self.cache.lock().ok()?.get(token, path, now)
    }

    async fn review(&self, token: &str, path: &str) -> Decision {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let reviewed = match Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
        {
            Ok(reviewed) => reviewed,
            Err(error) => {
                warn!(%error, "TokenReview failed; /metrics answers 500");
                return Decision::Unavailable;
            }
        };
        let Some(status) = reviewed.status.filter(|s| s.authenticated == Some(true)) else {
            return Decision::Unauthenticated;
        };
        let user = status.user.unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some("get".into()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        match Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
        {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => Decision::Allowed,
            Ok(_) => Decision::Forbidden(user.username.unwrap_or_default()),
            Err(error) => {
                warn!(%error, "SubjectAccessReview failed; /metrics answers 500");
                Decision::Unavailable
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_expire_and_unavailable_is_not_cached() {
        let mut cache = DecisionCache::new(Duration::from_secs(10), 8);
        let t0 = Instant::now();
        cache.put("tok", "/metrics", Decision::Allowed, t0);
        assert_eq!(
            cache.get("tok", "/metrics", t0 + Duration::from_secs(9)),
            Some(Decision::Allowed)
        );
        assert_eq!(
            cache.get("tok", "/metrics", t0 + Duration::from_secs(10)),
            None,
            "expired"
        );
        assert_eq!(cache.get("tok", "/other", t0), None, "per path");
        assert_eq!(cache.get("other", "/metrics", t0), None, "per token");
        cache.put("bad", "/metrics", Decision::Unavailable, t0);
        assert_eq!(cache.get("bad", "/metrics", t0), None);
    }

    #[test]
    fn the_cache_stays_bounded() {
        let mut cache = DecisionCache::new(Duration::from_secs(10), 4);
        let t0 = Instant::now();
        for i in 0..100 {
            cache.put(&format!("t{i}"), "/metrics", Decision::Unauthenticated, t0);
            assert!(cache.len() <= 4);
        }
        // Expired entries make room first.
        let mut cache = DecisionCache::new(Duration::from_secs(10), 2);
        cache.put("old", "/metrics", Decision::Allowed, t0);
        cache.put("new", "/metrics", Decision::Allowed, t0 + Duration::from_secs(5));
        cache.put(
            "newer",
            "/metrics",
            Decision::Allowed,
            t0 + Duration::from_secs(12),
        );
        assert_eq!(cache.len(), 2);
        assert!(
            cache
                .get("new", "/metrics", t0 + Duration::from_secs(12))
                .is_some()
        );
    }
}
