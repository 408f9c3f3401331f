use super::*;
use crate::route::tests::{virtual_inbound_listeners, virtual_inbound_with};
use prost::Message as _;
use remora_xds::model::listener::ConnectionFacts;
use remora_xds::sink::{type_url, Resource, Sink, Update};

/// The chain a connection to `dst` over `transport` takes in `store` now.
fn taken(store: &Store, dst: &str, transport: &'static str) -> ChainRef {
    let alpn: &[&str] = match transport {
        "tls" => &["istio-http/1.1"],
        _ => &["http/1.1"],
    };
    let facts = ConnectionFacts {
        destination: dst.parse().expect("addr"),
        server_name: None,
        transport_protocol: transport,
        application_protocols: alpn,
    };
    crate::route::inbound(&store.snapshot(), &facts, 0)
        .and_then(|i| i.chain)
        .expect("a chain")
}

/// Push `virtualInbound` with or without port 9080's plaintext chain.
fn push(store: &Store, plaintext_9080: bool, version: &str) {
    let listener = &virtual_inbound_listeners(plaintext_9080)[0];
    let body = remora_xds::json::from_json(listener, "envoy.config.listener.v3.Listener")
        .expect("a listener")
        .encode_to_vec();
    let applied = store.apply(
        type_url::LISTENER,
        Update {
            resources: vec![Resource {
                name: "virtualInbound".into(),
                version: version.into(),
                body,
            }],
            removed: vec![],
            complete: false,
        },
    );
    assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
}

#[tokio::test(start_paused = true)]
async fn a_removed_chains_connections_end_after_the_drain_time_and_the_others_stay() {
    let store = Arc::new(virtual_inbound_with(true));
    let drains = Arc::new(ChainDrains::default());
    let plaintext = drains.watch(&store, taken(&store, "10.0.0.5:9080", "raw_buffer"));
    let mtls = drains.watch(&store, taken(&store, "10.0.0.5:9080", "tls"));
    let drain_time = Duration::from_secs(2);
    {
        let (plain_cut, mtls_cut) = (plaintext.deadline(drain_time), mtls.deadline(drain_time));
        tokio::pin!(plain_cut, mtls_cut);
        // The same listener pushed again (a new version, the same chains): nothing drains.
        push(&store, true, "2");
        let quiet = tokio::time::timeout(Duration::from_secs(60), &mut plain_cut).await;
        assert!(quiet.is_err(), "an unchanged chain is not drained");
        // STRICT for 9080: its plaintext chain is removed, its mTLS chain stays as it was.
        push(&store, false, "3");
        let started = tokio::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(60), &mut plain_cut)
            .await
            .expect("the removed chain's connection is cut");
        let waited = started.elapsed();
        assert!(
            waited >= drain_time && waited < drain_time + Duration::from_millis(100),
            "cut after {waited:?}, the drain time being {drain_time:?}"
        );
        let kept = tokio::time::timeout(Duration::from_secs(600), &mut mtls_cut).await;
        assert!(kept.is_err(), "the unchanged chain's connection stays");
    }
    // Both left the registry: the one retired at once, the other as it is dropped.
    assert_eq!(lock(&drains.watched).by_id.len(), 1);
    drop(mtls);
    assert!(lock(&drains.watched).by_id.is_empty());
    // A connection that took a chain an update already retired is signalled at once.
    let old = taken(&store, "10.0.0.5:9081", "raw_buffer");
    push(&store, true, "4");
    let late = drains.watch(&store, old);
    tokio::time::timeout(Duration::from_millis(10), late.retired())
        .await
        .expect("retired before it was watched");
}
