//! Where the DNS proxy finds the mesh's names: the name table in the xDS store (istiod's NDS,
//! or a `name_tables` file in file mode), turned into a [`LookupTable`] for this pod. The
//! lookup table is rebuilt when the store holds another table, by the first query that sees
//! it (the store publishes whole snapshots, so comparing the entry's identity is enough);
//! building is linear in the table, a few milliseconds for a large mesh, once per push.

use super::answer::{self, Question};
use super::table::{Context, Lookup, LookupTable, Record};
use super::Transport;
use arc_swap::ArcSwapOption;
use remora_xds::convert::name_table::NameTableProto;
use remora_xds::snapshot::Entry;
use remora_xds::store::Store;
use std::sync::{Arc, Mutex};

/// What the table says of one query.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Answered locally: the response.
    Answer(Vec<u8>),
    /// No table yet from istiod: SERVFAIL, as pilot-agent answers before its first table
    /// (the client retries; a forwarded answer could contradict the table a moment later).
    NotSynced,
    /// Not a mesh name: forward.
    Forward,
}

/// The mesh's names for one pod.
#[derive(Debug)]
pub struct Names {
    store: Arc<Store>,
    context: Context,
    /// Whether a table is expected from istiod (NDS subscribed): until one arrives, queries
    /// get SERVFAIL. In file mode nothing is awaited, everything is forwarded until a table.
    awaits_table: bool,
    built: ArcSwapOption<Built>,
    building: Mutex<()>,
}

#[derive(Debug)]
struct Built {
    entry: Arc<Entry<NameTableProto>>,
    table: LookupTable,
}

impl Names {
    pub fn new(store: Arc<Store>, context: Context, awaits_table: bool) -> Names {
        Names {
            store,
            context,
            awaits_table,
            built: ArcSwapOption::empty(),
            building: Mutex::new(()),
        }
    }

    /// The verdict on `query` (a message that passed `message::is_query`).
    pub fn answer(&self, query: &[u8], transport: Transport) -> Verdict {
        let Some(built) = self.current() else {
            return match self.awaits_table {
                true => Verdict::NotSynced,
                false => Verdict::Forward,
            };
        };
        let Some(question) = answer::question(query) else {
            return Verdict::Forward;
        };
        match built.table.lookup(&question.name, question.family()) {
            Lookup::Forward => Verdict::Forward,
            Lookup::Answer(mut records) => {
                shuffle_addresses(&mut records);
                Verdict::Answer(respond(query, &question, &records, transport))
            }
        }
    }

    /// The lookup table for the table the store holds now, rebuilt if that changed.
    fn current(&self) -> Option<Arc<Built>> {
        let snapshot = self.store.current();
        let entry = snapshot.name_table()?;
        let is_current =
            |b: &Option<Arc<Built>>| b.as_ref().filter(|b| Arc::ptr_eq(&b.entry, entry)).cloned();
        if let Some(b) = is_current(&self.built.load_full()) {
            return Some(b);
        }
        // One builder at a time; the others find its work done.
        let _building = self
            .building
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(b) = is_current(&self.built.load_full()) {
            return Some(b);
        }
        let table = LookupTable::build(&entry.model, &self.context);
        tracing::info!(names = table.len(), hosts = entry.model.hosts.len(), version = %entry.version, "DNS name table in force");
        let built = Arc::new(Built {
            entry: Arc::clone(entry),
            table,
        });
        self.built.store(Some(Arc::clone(&built)));
        Some(built)
    }
}

fn respond(query: &[u8], question: &Question, records: &[Record], transport: Transport) -> Vec<u8> {
    let limit = match transport {
        Transport::Udp => answer::udp_limit(query, question),
        Transport::Tcp => answer::TCP_MAX,
    };
    answer::response(query, question, records, limit)
}

/// Addresses in random order behind any CNAME, as pilot-agent (and kube-dns) serve them, so
/// that clients taking the first address spread over a headless service's pods.
fn shuffle_addresses(records: &mut [Record]) {
    let first_address = records
        .iter()
        .position(|r| !matches!(r, Record::Cname { .. }))
        .unwrap_or(records.len());
    fastrand::shuffle(&mut records[first_address..]);
}
