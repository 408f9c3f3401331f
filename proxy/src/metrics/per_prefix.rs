//! Counters kept per stat prefix, as Envoy keeps a filter's statistics under the prefix of the
//! connection manager or filter that owns them (`http.<prefix>.fault.*`,
//! `ext_authz.<prefix>.*`): made when first counted, kept across config versions, shared by
//! every filter with the same prefix. As many as the configuration's stat prefixes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// One set of counters `C` per stat prefix, in the prefixes' order.
#[derive(Debug)]
pub struct PerPrefix<C>(Mutex<BTreeMap<Arc<str>, Arc<C>>>);

impl<C> Default for PerPrefix<C> {
    fn default() -> Self {
        PerPrefix(Mutex::default())
    }
}

impl<C: Default> PerPrefix<C> {
    /// The counters of `prefix`, made the first time it is asked for.
    pub fn of(&self, prefix: &str) -> Arc<C> {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = all.get(prefix) {
            return Arc::clone(c);
        }
        Arc::clone(all.entry(Arc::from(prefix)).or_default())
    }

    /// Each prefix with its counters.
    pub fn each(&self) -> Vec<(Arc<str>, Arc<C>)> {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.iter()
            .map(|(p, c)| (Arc::clone(p), Arc::clone(c)))
            .collect()
    }
}
