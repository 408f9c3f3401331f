//! The ADS client in delta mode against a scripted control plane over a real socket: the
//! requests it sends, in order, for the responses it gets.

mod ads_support;

use std::time::{Duration, Instant};

use ads_support::*;
use envoy_types::pb::envoy::config::core::v3::ControlPlane;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use remora_xds::ads::Mode;
use remora_xds::sink::type_url::{CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET};

fn sorted(mut names: Vec<String>) -> Vec<String> {
    names.sort();
    names
}

fn nack_message(request: &DeltaDiscoveryRequest) -> String {
    let detail = request.error_detail.clone().expect("a NACK");
    assert_eq!(detail.code, 13, "Envoy NACKs with INTERNAL");
    detail.message
}

#[tokio::test]
async fn subscribes_in_envoys_order_and_acks_with_the_nonce() {
    let mut server = Server::start().await;
    let client = start_client(&server, Mode::Delta, Duration::from_millis(50));
    let mut stream = server.delta_stream().await;

    assert_eq!(
        stream
            .metadata
            .get("authorization")
            .map(|v| v.to_str().ok()),
        Some(Some("Bearer token-1"))
    );
    assert_eq!(
        stream.metadata.get("clusterid").map(|v| v.to_str().ok()),
        Some(Some("Kubernetes"))
    );

    // CDS first, alone, as a legacy wildcard, carrying the node.
    let cds = stream.request().await;
    assert_eq!(cds.type_url, CLUSTER);
    assert!(cds.resource_names_subscribe.is_empty());
    assert!(cds.initial_resource_versions.is_empty());
    assert!(cds.response_nonce.is_empty());
    let node = cds.node.expect("the first request carries the node");
    assert_eq!(
        node.id,
        "sidecar~10.0.0.7~app-1.default~default.svc.cluster.local"
    );
    assert_eq!(node.user_agent_name, "remora");
    assert!(
        stream.quiet_for(Duration::from_millis(200)).await,
        "LDS waits for CDS"
    );

    stream.respond(delta_response(
        CLUSTER,
        "n1",
        vec![
            delta_resource(CLUSTER, "a", "1"),
            delta_resource(CLUSTER, "b", "1"),
        ],
        &[],
    ));
    // The EDS interest the clusters cause goes out before their ACK, as Envoy sends it.
    let eds = stream.request().await;
    assert_eq!(eds.type_url, ENDPOINT);
    assert_eq!(sorted(eds.resource_names_subscribe), names(&["a", "b"]));
    assert!(eds.response_nonce.is_empty());
    assert!(
        eds.node.is_none(),
        "the node goes in the first request only"
    );
    let ack = stream.request().await;
    assert_eq!(
        (ack.type_url.as_str(), ack.response_nonce.as_str()),
        (CLUSTER, "n1")
    );
    assert!(ack.error_detail.is_none());

    // LDS starts once every endpoint set of the first clusters has arrived.
    let mut response = delta_response(
        ENDPOINT,
        "n2",
        vec![delta_resource(ENDPOINT, "a", "e1")],
        &[],
    );
    response.control_plane = Some(ControlPlane {
        identifier: "istiod-7d4f".to_owned(),
    });
    stream.respond(response);
    let ack = stream.request().await;
    assert_eq!(
        (ack.type_url.as_str(), ack.response_nonce.as_str()),
        (ENDPOINT, "n2")
    );
    assert!(
        stream.quiet_for(Duration::from_millis(200)).await,
        "still waiting for b"
    );
    stream.respond(delta_response(
        ENDPOINT,
        "n3",
        vec![delta_resource(ENDPOINT, "b", "e1")],
        &[],
    ));
    let lds = stream.request().await;
    assert_eq!(lds.type_url, LISTENER);
    assert!(lds.resource_names_subscribe.is_empty());
    assert_eq!(stream.request().await.response_nonce, "n3");

    // RDS follows the listeners.
    stream.respond(delta_response(
        LISTENER,
        "n4",
        vec![delta_resource(LISTENER, "l1", "1")],
        &[],
    ));
    let rds = stream.request().await;
    assert_eq!(rds.type_url, ROUTE);
    assert_eq!(rds.resource_names_subscribe, names(&["routes-l1"]));
    assert_eq!(stream.request().await.response_nonce, "n4");

    // Removing a cluster unsubscribes its endpoints.
    stream.respond(delta_response(CLUSTER, "n5", vec![], &["b"]));
    let eds = stream.request().await;
    assert_eq!(eds.type_url, ENDPOINT);
    assert!(eds.resource_names_subscribe.is_empty());
    assert_eq!(eds.resource_names_unsubscribe, names(&["b"]));
    // No cluster added, none warming: the ACK goes at once.
    assert_eq!(stream.request().await.response_nonce, "n5");

    // After start-up, a new cluster warms: its CDS ACK waits for its endpoints.
    stream.respond(delta_response(
        CLUSTER,
        "n6",
        vec![delta_resource(CLUSTER, "c", "1")],
        &[],
    ));
    let eds = stream.request().await;
    assert_eq!(eds.resource_names_subscribe, names(&["c"]));
    assert!(
        stream.quiet_for(Duration::from_millis(300)).await,
        "the CDS ACK waits while c warms"
    );
    stream.respond(delta_response(
        ENDPOINT,
        "n7",
        vec![delta_resource(ENDPOINT, "c", "e1")],
        &[],
    ));
    let ack = stream.request().await;
    assert_eq!(
        (ack.type_url.as_str(), ack.response_nonce.as_str()),
        (CLUSTER, "n6")
    );
    let ack = stream.request().await;
    assert_eq!(
        (ack.type_url.as_str(), ack.response_nonce.as_str()),
        (ENDPOINT, "n7")
    );

    let stats = client.stats.snapshot();
    assert_eq!(stats.connected_state, 1);
    assert_eq!(stats.identifier, "istiod-7d4f");
    let cds = stats.of(CLUSTER).expect("cds stats");
    assert_eq!((cds.update_success, cds.update_rejected), (3, 0));
    assert_eq!(cds.status.version_text, "sys-n6");
    assert_eq!(stats.of(ENDPOINT).map(|s| s.update_success), Some(3));
}

/// Secrets istiod serves itself (a DestinationRule's `credentialName`): asked for by name
/// once the cluster's endpoints have arrived, before their ACK; start-up and, later, a new
/// cluster's CDS ACK wait for them as for endpoints (Envoy's cluster warms on its SDS
/// subscriptions; `ads_envoy.rs` compares the whole exchange with Envoy's).
#[tokio::test]
async fn secrets_are_asked_for_after_the_endpoints_and_clusters_warm_on_them() {
    let mut server = Server::start().await;
    let _client = start_client(&server, Mode::Delta, Duration::from_millis(50));
    let mut stream = server.delta_stream().await;
    assert_eq!(stream.request().await.type_url, CLUSTER);
    stream.respond(delta_response(
        CLUSTER,
        "n1",
        vec![delta_resource(CLUSTER, "tls-a", "1")],
        &[],
    ));
    let eds = stream.request().await;
    assert_eq!(
        (eds.type_url.as_str(), eds.resource_names_subscribe),
        (ENDPOINT, names(&["tls-a"]))
    );
    assert_eq!(stream.request().await.response_nonce, "n1");
    stream.respond(delta_response(
        ENDPOINT,
        "n2",
        vec![delta_resource(ENDPOINT, "tls-a", "e1")],
        &[],
    ));
    let sds = stream.request().await;
    assert_eq!(
        (sds.type_url.as_str(), sds.resource_names_subscribe),
        (SECRET, names(&["secret-tls-a"]))
    );
    assert_eq!(stream.request().await.response_nonce, "n2");
    assert!(
        stream.quiet_for(Duration::from_millis(200)).await,
        "LDS waits for the secret too"
    );
    stream.respond(delta_response(
        SECRET,
        "n3",
        vec![delta_resource(SECRET, "secret-tls-a", "s1")],
        &[],
    ));
    assert_eq!(stream.request().await.type_url, LISTENER);
    assert_eq!(stream.request().await.response_nonce, "n3");

    // After start-up: a new cluster's CDS ACK waits for its endpoints, then its secret.
    stream.respond(delta_response(
        CLUSTER,
        "n4",
        vec![delta_resource(CLUSTER, "tls-b", "1")],
        &[],
    ));
    assert_eq!(stream.request().await.type_url, ENDPOINT);
    stream.respond(delta_response(
        ENDPOINT,
        "n5",
        vec![delta_resource(ENDPOINT, "tls-b", "e1")],
        &[],
    ));
    let sds = stream.request().await;
    assert_eq!(
        (sds.type_url.as_str(), sds.resource_names_subscribe),
        (SECRET, names(&["secret-tls-b"]))
    );
    assert_eq!(stream.request().await.response_nonce, "n5");
    assert!(
        stream.quiet_for(Duration::from_millis(300)).await,
        "the CDS ACK waits while tls-b's secret is awaited"
    );
    stream.respond(delta_response(
        SECRET,
        "n6",
        vec![delta_resource(SECRET, "secret-tls-b", "s1")],
        &[],
    ));
    assert_eq!(stream.request().await.response_nonce, "n4");
    assert_eq!(stream.request().await.response_nonce, "n6");
}

#[tokio::test]
async fn nack_names_each_refused_resource_and_applies_the_rest() {
    let mut server = Server::start().await;
    let client = start_client(&server, Mode::Delta, Duration::from_millis(50));
    client.sink.refuse("b", "unsupported field lb_policy");
    client.sink.refuse("c", "unknown filter");
    let mut stream = server.delta_stream().await;
    stream.request().await;

    stream.respond(delta_response(
        CLUSTER,
        "n1",
        vec![
            delta_resource(CLUSTER, "a", "1"),
            delta_resource(CLUSTER, "b", "1"),
            delta_resource(CLUSTER, "c", "1"),
        ],
        &[],
    ));
    // The accepted cluster is applied and its endpoints subscribed.
    let eds = stream.request().await;
    assert_eq!(eds.resource_names_subscribe, names(&["a"]));
    let nack = stream.request().await;
    assert_eq!(nack.response_nonce, "n1");
    assert_eq!(
        nack_message(&nack),
        "Error adding/updating cluster(s) b: unsupported field lb_policy, c: unknown filter"
    );
    assert_eq!(
        client
            .sink
            .held(CLUSTER)
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        names(&["a"])
    );

    let stats = client.stats.snapshot();
    let cds = stats.of(CLUSTER).expect("cds stats");
    assert_eq!((cds.update_success, cds.update_rejected), (0, 1));
    let error = cds.status.last_error.clone().expect("the NACK is recorded");
    assert_eq!(error.nonce, "n1");
    assert!(error.message.contains("b: unsupported field lb_policy"));
}

#[tokio::test]
async fn malformed_resources_are_nacked_not_panicked_on() {
    let mut server = Server::start().await;
    let client = start_client(&server, Mode::Delta, Duration::from_millis(50));
    let mut stream = server.delta_stream().await;
    stream.request().await;

    // A body that is not a protobuf message: refused by name, the others applied.
    let mut garbage = delta_resource(CLUSTER, "garbage", "1");
    if let Some(body) = garbage.resource.as_mut() {
        body.value = vec![0x0a, 0xff, 0xff];
    }
    stream.respond(delta_response(
        CLUSTER,
        "n1",
        vec![delta_resource(CLUSTER, "good", "1"), garbage],
        &[],
    ));
    let eds = stream.request().await; // EDS for "good"
    assert_eq!(eds.resource_names_subscribe, names(&["good"]));
    let nack = stream.request().await;
    let message = nack_message(&nack);
    assert!(
        message.starts_with("Error adding/updating cluster(s) garbage: cannot decode"),
        "{message}"
    );
    assert!(client.sink.held(CLUSTER).contains_key("good"));

    // An Any of another type refuses the whole response, in Envoy's words.
    let mut wrong = delta_resource(CLUSTER, "x", "1");
    if let Some(body) = wrong.resource.as_mut() {
        body.type_url = LISTENER.to_owned();
    }
    stream.respond(delta_response(
        CLUSTER,
        "n2",
        vec![delta_resource(CLUSTER, "y", "1"), wrong],
        &[],
    ));
    let nack = stream.request().await;
    assert_eq!(nack.response_nonce, "n2");
    assert!(nack_message(&nack).contains(&format!(
        "type URL {LISTENER} embedded in an individual Any does not match the message-wide type URL {CLUSTER}"
    )));
    assert!(
        !client.sink.held(CLUSTER).contains_key("y"),
        "nothing of it is applied"
    );

    // A name twice is a whole-response fault too.
    stream.respond(delta_response(
        CLUSTER,
        "n3",
        vec![
            delta_resource(CLUSTER, "z", "1"),
            delta_resource(CLUSTER, "z", "2"),
        ],
        &[],
    ));
    let nack = stream.request().await;
    assert_eq!(
        nack_message(&nack),
        "duplicate name z found among added/updated resources"
    );
    assert_eq!(
        client
            .stats
            .snapshot()
            .of(CLUSTER)
            .map(|c| c.update_rejected),
        Some(3)
    );
}

#[tokio::test]
async fn reconnects_with_backoff_and_resubscribes_with_the_versions_held() {
    let mut server = Server::start().await;
    let client = start_client(&server, Mode::Delta, Duration::from_millis(300));
    let mut stream = server.delta_stream().await;
    stream.request().await;
    stream.respond(delta_response(
        CLUSTER,
        "n1",
        vec![
            delta_resource(CLUSTER, "a", "1"),
            delta_resource(CLUSTER, "b", "2"),
        ],
        &[],
    ));
    stream.request().await; // ACK
    stream.request().await; // EDS a, b
    stream.respond(delta_response(
        ENDPOINT,
        "n2",
        vec![delta_resource(ENDPOINT, "a", "e1")],
        &[],
    ));
    stream.request().await; // ACK
    let applies = client
        .sink
        .applies
        .load(std::sync::atomic::Ordering::SeqCst);

    // The control plane goes away.
    let dropped = Instant::now();
    drop(stream);
    let mut stream = server.delta_stream().await;
    let waited = dropped.elapsed();
    // Full jitter in [0, 300 ms) plus the time to reconnect.
    assert!(
        waited < Duration::from_millis(1500),
        "reconnected after {waited:?}"
    );
    assert_eq!(
        stream
            .metadata
            .get("authorization")
            .map(|v| v.to_str().ok()),
        Some(Some("Bearer token-2")),
        "the token is read again for the new stream"
    );

    let cds = stream.request().await;
    assert_eq!(cds.type_url, CLUSTER);
    assert!(cds.node.is_some(), "a new stream opens with the node");
    assert!(cds.resource_names_subscribe.is_empty());
    assert!(cds.response_nonce.is_empty());
    assert_eq!(
        cds.initial_resource_versions.get("a").map(String::as_str),
        Some("1")
    );
    assert_eq!(
        cds.initial_resource_versions.get("b").map(String::as_str),
        Some("2")
    );
    let eds = stream.request().await;
    assert_eq!(eds.type_url, ENDPOINT);
    assert!(eds.node.is_none());
    assert_eq!(sorted(eds.resource_names_subscribe), names(&["a", "b"]));
    assert_eq!(eds.initial_resource_versions.len(), 1);
    assert_eq!(
        eds.initial_resource_versions.get("a").map(String::as_str),
        Some("e1")
    );

    // The sink was not touched by the disconnect: its configuration stays in force.
    assert_eq!(
        client
            .sink
            .applies
            .load(std::sync::atomic::Ordering::SeqCst),
        applies
    );
    assert_eq!(client.sink.held(CLUSTER).len(), 2);
    let stats = client.stats.snapshot();
    assert_eq!(stats.of(CLUSTER).map(|c| c.update_failure), Some(1));
    assert_eq!(stats.of(ENDPOINT).map(|c| c.update_failure), Some(1));
    // Envoy's update_attempt: the subscription's start, each update, each stream failure.
    assert_eq!(stats.of(CLUSTER).map(|c| c.update_attempt), Some(3));
    assert_eq!(stats.of(ENDPOINT).map(|c| c.update_attempt), Some(3));
    assert_eq!(
        stats.of(LISTENER).map(|c| c.update_failure),
        Some(0),
        "LDS had not started"
    );
}

#[tokio::test]
async fn connected_state_drops_while_the_control_plane_is_away() {
    let mut server = Server::start().await;
    // A long back-off so the gap is observable.
    let client = start_client(&server, Mode::Delta, Duration::from_secs(1));
    let mut stream = server.delta_stream().await;
    stream.request().await;
    stream.respond(delta_response(CLUSTER, "n1", vec![], &[]));
    stream.request().await;
    assert_eq!(client.stats.snapshot().connected_state, 1);
    // Away until told otherwise: the back-off's full jitter may retry within milliseconds,
    // and a control plane that took the retry at once would close the gap before it is seen.
    server.set_away(true);
    drop(stream);
    let deadline = Instant::now() + WAIT;
    while client.stats.snapshot().connected_state == 1 {
        assert!(Instant::now() < deadline, "connected_state never dropped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Refused retries keep it down.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(client.stats.snapshot().connected_state, 0);
    server.set_away(false);
    let _stream = server.delta_stream().await;
    let deadline = Instant::now() + WAIT;
    while client.stats.snapshot().connected_state == 0 {
        assert!(Instant::now() < deadline, "connected_state never came back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn listeners_are_requested_after_the_initial_fetch_timeout_without_endpoints() {
    let mut server = Server::start().await;
    let started = Instant::now();
    let _client = start_client_with(&server, Mode::Delta, |config| {
        config.initial_fetch_timeout = Duration::from_millis(400);
    });
    let mut stream = server.delta_stream().await;
    stream.request().await;
    stream.respond(delta_response(
        CLUSTER,
        "n1",
        vec![delta_resource(CLUSTER, "a", "1")],
        &[],
    ));
    stream.request().await; // ACK
    stream.request().await; // EDS a, never answered
    let lds = stream.request().await;
    assert_eq!(lds.type_url, LISTENER);
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "LDS came before the timeout"
    );
}

#[tokio::test]
async fn an_oversized_response_ends_the_stream_and_keeps_the_config() {
    let mut server = Server::start().await;
    let client = start_client_with(&server, Mode::Delta, |config| {
        config.max_message_size = 16 * 1024;
        config.backoff_base = Duration::from_millis(50);
    });
    let mut stream = server.delta_stream().await;
    stream.request().await;
    stream.respond(delta_response(
        CLUSTER,
        "n1",
        vec![delta_resource(CLUSTER, "a", "1")],
        &[],
    ));
    stream.request().await; // EDS a
    stream.request().await; // ACK

    let huge = "x".repeat(32 * 1024);
    stream.respond(delta_response(
        CLUSTER,
        "n2",
        vec![delta_resource(CLUSTER, &huge, "2")],
        &[],
    ));
    // Nothing can be answered for a message that cannot be read: the stream is dropped and
    // opened again, resubscribing with what is held.
    let mut stream = server.delta_stream().await;
    let cds = stream.request().await;
    assert_eq!(
        cds.initial_resource_versions
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        names(&["a"])
    );
    assert_eq!(
        client
            .sink
            .held(CLUSTER)
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        names(&["a"])
    );
    assert_eq!(
        client
            .stats
            .snapshot()
            .of(CLUSTER)
            .map(|c| c.update_failure),
        Some(1)
    );
}

#[tokio::test]
async fn shutdown_ends_the_stream() {
    let mut server = Server::start().await;
    let client = start_client(&server, Mode::Delta, Duration::from_millis(50));
    let mut stream = server.delta_stream().await;
    stream.request().await;
    drop(client);
    assert!(
        stream.ended_within(WAIT).await,
        "the stream outlived shutdown"
    );
}

#[tokio::test]
async fn reconnect_delays_stay_within_envoys_jittered_exponential_bounds() {
    let mut server = Server::start().await;
    let base = Duration::from_millis(100);
    let client = start_client_with(&server, Mode::Delta, |config| {
        config.backoff_base = base;
        config.backoff_max = Duration::from_millis(400);
    });
    // Streams that end before any response: the back-off is never reset, so the n-th wait is
    // drawn from [0, min(100 ms * 2^n, 400 ms)).
    let slack = Duration::from_millis(300);
    let mut stream = server.delta_stream().await;
    for bound_ms in [100, 200, 400, 400, 400] {
        drop(stream);
        let dropped = Instant::now();
        stream = server.delta_stream().await;
        let waited = dropped.elapsed();
        let bound = Duration::from_millis(bound_ms) + slack;
        assert!(waited < bound, "waited {waited:?}, bound {bound:?}");
    }
    let stats = client.stats.snapshot();
    assert_eq!(stats.of(CLUSTER).map(|c| c.update_failure), Some(5));

    // A response resets it: the next wait is within the base interval again.
    stream.request().await;
    stream.respond(delta_response(CLUSTER, "n1", vec![], &[]));
    stream.request().await; // ACK
    drop(stream);
    let dropped = Instant::now();
    let _stream = server.delta_stream().await;
    assert!(dropped.elapsed() < base + slack);
}

#[tokio::test]
async fn unreadable_call_metadata_is_retried_with_backoff() {
    let mut server = Server::start().await;
    let client = start_client_failing(&server, Mode::Delta, 2, |config| {
        config.backoff_base = Duration::from_millis(50);
    });
    let stream = server.delta_stream().await;
    // Two failed attempts opened no stream; the third carries the token it read.
    assert_eq!(
        client
            .metadata_calls
            .load(std::sync::atomic::Ordering::SeqCst),
        3
    );
    assert_eq!(
        stream
            .metadata
            .get("authorization")
            .map(|v| v.to_str().ok()),
        Some(Some("Bearer token-3"))
    );
    let stats = client.stats.snapshot();
    assert_eq!(stats.of(CLUSTER).map(|c| c.update_failure), Some(2));
}
