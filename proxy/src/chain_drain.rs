//! Draining the connections of a filter chain that an xDS update changed or removed, as Envoy
//! drains them (`ListenerManagerImpl::drainFilterChains`): a connection keeps the chain it
//! started on ([`ChainRef`] holds it), and once a listener update no longer has that chain as
//! it was, the connection is told to go at once (HTTP: `connection: close` on the next
//! response, or GOAWAY; see `http::drive` and the HTTP/1.1 fast path) and closed when
//! `drain.drain_time` has passed (Envoy's `--drain-time-s`, from ProxyConfig's
//! `drainDuration`), HTTP and TCP alike: the close Envoy names `filter_chain_is_being_removed`.
//! Connections of chains an update left as they were keep going.
//!
//! One task per proxy looks at each listener update ([`Store::listeners_changed`]) and
//! signals the connections whose chain it retired; a connection registers its chain once
//! ([`ChainDrains::watch`]) and its wait is a flag and a waker of its own. Polling the store's
//! notification from every connection instead would take that notification's lock each time
//! a copy loop or an HTTP connection wakes. Chains are compared once per update and chain,
//! whatever the number of connections on it.

use crate::route::ChainRef;
use remora_xds::snapshot::Snapshot;
use remora_xds::store::Store;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// The connections watched for the retirement of their chain.
#[derive(Debug, Default)]
pub struct ChainDrains {
    watched: Mutex<Watched>,
}

#[derive(Debug, Default)]
struct Watched {
    next: u64,
    by_id: foldhash::HashMap<u64, (ChainRef, Arc<Signal>)>,
    /// The task that looks at each listener update has been started.
    sweeping: bool,
}

/// Set once the chain of a connection is retired.
#[derive(Debug, Default)]
struct Signal {
    retired: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Signal {
    fn retire(&self) -> Option<Waker> {
        self.retired.store(true, Ordering::Release);
        lock(&self.waker).take()
    }
}

/// One connection's watch on its chain; unregistered when dropped.
#[derive(Debug)]
pub struct Watch {
    drains: Arc<ChainDrains>,
    id: u64,
    signal: Arc<Signal>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Nothing here leaves the data half-updated on a panic.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ChainDrains {
    /// Watch `chain` for a listener update of `store` that changes or removes it. The first
    /// watch starts the task that looks at each update.
    pub fn watch(self: &Arc<Self>, store: &Arc<Store>, chain: ChainRef) -> Watch {
        let signal = Arc::new(Signal::default());
        let id = {
            let mut watched = lock(&self.watched);
            if !watched.sweeping {
                watched.sweeping = true;
                tokio::spawn(Arc::clone(self).sweep_each_update(Arc::clone(store)));
            }
            watched.next += 1;
            let id = watched.next;
            watched
                .by_id
                .insert(id, (chain.clone(), Arc::clone(&signal)));
            id
        };
        // Registered first, looked at second: an update the task swept before this watch was
        // in its map is seen here.
        if !chain.is_current(&store.current()) {
            signal.retire();
            lock(&self.watched).by_id.remove(&id);
        }
        Watch {
            drains: Arc::clone(self),
            id,
            signal,
        }
    }

    async fn sweep_each_update(self: Arc<Self>, store: Arc<Store>) {
        loop {
            let changed = store.listeners_changed();
            tokio::pin!(changed);
            // Registered before the look, so that an update between the two is not missed.
            changed.as_mut().enable();
            self.sweep(&store.current());
            changed.await;
        }
    }

    /// Signal every watched connection whose chain `snapshot` no longer has as it was.
    fn sweep(&self, snapshot: &Snapshot) {
        let mut wake = Vec::new();
        {
            let mut watched = lock(&self.watched);
            let mut verdicts = foldhash::HashMap::<(usize, usize), bool>::default();
            watched.by_id.retain(|_, (chain, signal)| {
                let current = *verdicts
                    .entry(chain.key())
                    .or_insert_with(|| chain.is_current(snapshot));
                if !current {
                    wake.extend(signal.retire());
                }
                current
            });
        }
        if !wake.is_empty() {
            tracing::info!(
                connections = wake.len(),
                "an xDS update changed or removed filter chains: draining their connections"
            );
        }
        wake.into_iter().for_each(Waker::wake);
    }
}

impl Watch {
    /// Whether an xDS update has changed or removed the chain.
    #[inline]
    pub fn is_retired(&self) -> bool {
        self.signal.retired.load(Ordering::Acquire)
    }

    /// Resolves once an xDS update changed or removed the chain.
    pub async fn retired(&self) {
        let mut registered = None;
        std::future::poll_fn(|cx| self.poll_retired(&mut registered, cx)).await;
    }

    /// Ready once the chain is retired; else the task's waker is handed over to the sweep,
    /// only when it is not the one last handed (`registered`): a copy loop or an HTTP
    /// connection that wakes for its bytes then pays one load and a compare, no lock.
    #[inline]
    fn poll_retired(&self, registered: &mut Option<Waker>, cx: &Context<'_>) -> Poll<()> {
        if self.is_retired() {
            return Poll::Ready(());
        }
        if !registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            *lock(&self.signal.waker) = Some(cx.waker().clone());
            *registered = Some(cx.waker().clone());
            // Retired meanwhile: the sweep took no waker, or the old one.
            if self.is_retired() {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    }

    /// Resolves `drain_time` after the chain is retired: when a connection still open on it
    /// is closed.
    pub fn deadline(&self, drain_time: Duration) -> Deadline<'_> {
        deadline(Some(self), drain_time)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        lock(&self.drains.watched).by_id.remove(&self.id);
    }
}

/// Resolves `drain_time` after the chain `watch` follows is retired; never without a watch
/// (a connection not decided by an xDS chain).
pub fn deadline(watch: Option<&Watch>, drain_time: Duration) -> Deadline<'_> {
    Deadline {
        watch,
        registered: None,
        drain_time,
        timer: None,
    }
}

/// The future of [`deadline`]. Every connection's future holds one and polls it each time it
/// wakes, so the wait for the retirement is polled in place; the timer (boxed: a `Sleep` is
/// large) exists only once the chain is retired.
pub struct Deadline<'a> {
    watch: Option<&'a Watch>,
    registered: Option<Waker>,
    drain_time: Duration,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Future for Deadline<'_> {
    type Output = ();

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        let Some(watch) = this.watch else {
            return Poll::Pending;
        };
        if this.timer.is_none() {
            if watch.poll_retired(&mut this.registered, cx).is_pending() {
                return Poll::Pending;
            }
            this.timer = Some(Box::pin(tokio::time::sleep(this.drain_time)));
        }
        match this.timer.as_mut() {
            Some(timer) => timer.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests;
