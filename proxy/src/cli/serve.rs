//! Serving once everything is bound: the accept loops, DNS, reloads, readiness, then the
//! shutdown that SIGTERM (drain first), SIGINT or `/quitquitquit` asks for.

use crate::admin::AdminState;
use crate::dns;
use crate::listener;
use crate::metrics::ServerState;
use crate::proxy::{Proxy, Route};
use crate::reload::Reloader;
use crate::Direction;
use anyhow::Context;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

/// Serves on the bound listeners until told to stop, draining first on SIGTERM.
pub(super) async fn serve(
    proxy: Arc<Proxy>,
    routes: Vec<(Route, std::net::TcpListener)>,
    dns: Option<dns::Dns>,
    state: Arc<AdminState>,
    reloader: Option<Reloader>,
) -> anyhow::Result<()> {
    let mut sigterm = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    let mut sigint = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    crate::access_log::reopen_on_sighup(&proxy.access_log).context("handling SIGHUP")?;
    let drain = Arc::clone(&proxy.drain);

    let global = listener::admission::GlobalCount::new(
        Arc::clone(&proxy.config),
        proxy.metrics.overload.clone(),
    );
    // One count per listener: the addresses of one port share it.
    let mut admissions: Vec<(Route, listener::admission::Admission)> = Vec::new();
    for (route, l) in routes {
        let l = TcpListener::from_std(l)?;
        tracing::info!(local = ?l.local_addr().ok(), ?route, "listening");
        let proxy = Arc::clone(&proxy);
        let drain = Arc::clone(&drain);
        let admission = match admissions.iter().find(|(r, _)| *r == route) {
            Some((_, a)) => a.clone(),
            None => {
                let a = global.listener(route.direction());
                admissions.push((route.clone(), a.clone()));
                a
            }
        };
        // Draining closes no listener: as Envoy under Istio (`drain_listeners?inboundonly&graceful`)
        // the inbound ones keep accepting, so a client told to go can reconnect and be served
        // (and told again), and outbound keeps serving the application. Only the admin API's
        // `/drain_listeners` closes them: the inbound ones (capture, and explicit listeners
        // terminating mesh TLS) for `?inboundonly`, all otherwise.
        if route.direction() == Direction::Inbound {
            let stop = async move { drain.inbound_listeners_closed().await };
            tokio::spawn(listener::accept_loop(l, route, proxy, admission, stop));
        } else {
            let stop = async move { drain.all_listeners_closed().await };
            tokio::spawn(listener::accept_loop(l, route, proxy, admission, stop));
        }
    }
    if let Some(dns) = dns {
        dns.spawn().context("serving DNS")?;
    }
    match reloader {
        Some(r) => {
            tokio::spawn(r.watch());
        }
        // SIGHUP's default action ends the process: without a file to reload, it must still
        // not take the pod's traffic down.
        None => {
            let mut hup = signal(SignalKind::hangup()).context("handling SIGHUP")?;
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP: no config file to reload (built-in defaults)");
                }
            });
        }
    }
    state.ready.store(true, Ordering::Release);
    state.metrics.server.set_state(ServerState::Live);
    tracing::info!("remora is ready");

    tokio::select! {
        _ = sigterm.recv() => {}
        _ = sigint.recv() => {
            tracing::info!("SIGINT: exiting now");
            return Ok(());
        }
        () = quit_requested(&state) => {
            tracing::info!("quitquitquit: exiting now");
            return Ok(());
        }
    }

    // A native sidecar drained by its preStop hook (`remora drain`, the agent's `/drain`) gets
    // SIGTERM once the application has stopped: nothing is left to drain for, and pilot-agent
    // exits at once then.
    if drain.drained_ahead() {
        tracing::info!("SIGTERM: already drained (/drain): exiting now");
        return Ok(());
    }
    let config = proxy.config.load_full();
    drain.start();
    state.metrics.server.set_state(ServerState::Draining);
    let active = drain.active();
    if config.drain.exit_on_zero_active_connections {
        let minimum = config.drain.minimum_duration;
        tracing::info!(
            active,
            ?minimum,
            "SIGTERM: draining until no connection is left"
        );
        tokio::select! {
            () = drain.no_connection_left(minimum) => {
                tracing::info!("no connection left: exiting");
            }
            () = quit_requested(&state) => tracing::info!("quitquitquit: exiting now"),
            _ = sigint.recv() => tracing::info!("SIGINT: exiting now"),
        }
    } else {
        tracing::info!(active, duration = ?config.drain.duration, "SIGTERM: draining");
        tokio::select! {
            () = tokio::time::sleep(config.drain.duration) => {
                tracing::info!(active = drain.active(), "drain period over: exiting");
            }
            () = quit_requested(&state) => tracing::info!("quitquitquit: exiting now"),
            _ = sigint.recv() => tracing::info!("SIGINT: exiting now"),
        }
    }
    Ok(())
}

/// Resolves after `/quitquitquit`, once its `OK` has had time to reach the caller: the answer is
/// written on the admin thread, and exiting the moment we are told would cut it off.
async fn quit_requested(state: &AdminState) {
    state.quit.notified().await;
    tokio::time::sleep(QUIT_RESPONSE_GRACE).await;
}

/// How long `/quitquitquit` waits for its own response to be sent.
const QUIT_RESPONSE_GRACE: Duration = Duration::from_millis(100);
