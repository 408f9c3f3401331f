//! The ADS client in state-of-the-world mode against a scripted control plane over a real
//! socket: versions and nonces in ACKs and NACKs, interest as full name lists, reconnects.

mod ads_support;

use std::time::Duration;

use ads_support::*;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, Resource as Wrapped};
use envoy_types::pb::google::protobuf::Any;
use remora_xds::ads::Mode;
use remora_xds::sink::type_url::{CLUSTER, ENDPOINT, LISTENER, ROUTE};

fn nack_message(request: &DiscoveryRequest) -> String {
    let detail = request.error_detail.clone().expect("a NACK");
    assert_eq!(detail.code, 13, "Envoy NACKs with INTERNAL");
    detail.message
}

/// (type, version_info, nonce) of a request.
fn shape(request: &DiscoveryRequest) -> (&str, &str, &str) {
    (
        request.type_url.as_str(),
        request.version_info.as_str(),
        request.response_nonce.as_str(),
    )
}

#[tokio::test]
async fn acks_carry_the_version_and_nonce_and_interest_follows_the_sink() {
    let mut server = Server::start().await;
    let client = start_client(&server, Mode::StateOfTheWorld, Duration::from_millis(50));
    let mut stream = server.sotw_stream().await;

    let cds = stream.request().await;
    assert_eq!(shape(&cds), (CLUSTER, "", ""));
    assert!(cds.resource_names.is_empty(), "CDS is a wildcard");
    assert_eq!(
        cds.node.map(|n| n.id),
        Some("sidecar~10.0.0.7~app-1.default~default.svc.cluster.local".to_owned())
    );
    assert!(
        stream.quiet_for(Duration::from_millis(200)).await,
        "LDS waits for CDS"
    );

    // The EDS interest the clusters cause goes out before their ACK, as Envoy sends it.
    stream.respond(sotw_response(CLUSTER, "c1", "n1", &["a", "b"]));
    let eds = stream.request().await;
    assert_eq!(shape(&eds), (ENDPOINT, "", ""));
    assert_eq!(eds.resource_names, names(&["a", "b"]));
    assert!(eds.node.is_none());
    let ack = stream.request().await;
    assert_eq!(shape(&ack), (CLUSTER, "c1", "n1"));
    assert!(ack.error_detail.is_none());

    // A CLA nobody asked for is not delivered.
    stream.respond(sotw_response(ENDPOINT, "e1", "n2", &["a", "b", "stranger"]));
    let lds = stream.request().await;
    assert_eq!(shape(&lds), (LISTENER, "", ""));
    assert!(lds.resource_names.is_empty());
    assert_eq!(shape(&stream.request().await), (ENDPOINT, "e1", "n2"));
    assert!(!client.sink.held(ENDPOINT).contains_key("stranger"));

    stream.respond(sotw_response(LISTENER, "l1", "n3", &["l"]));
    let rds = stream.request().await;
    assert_eq!(shape(&rds), (ROUTE, "", ""));
    assert_eq!(rds.resource_names, names(&["routes-l"]));
    assert_eq!(shape(&stream.request().await), (LISTENER, "l1", "n3"));

    // A cluster gone: EDS is asked again for the full new list, with its version and nonce.
    stream.respond(sotw_response(CLUSTER, "c2", "n4", &["a"]));
    let eds = stream.request().await;
    assert_eq!(shape(&eds), (ENDPOINT, "e1", "n2"));
    assert_eq!(eds.resource_names, names(&["a"]));
    assert_eq!(shape(&stream.request().await), (CLUSTER, "c2", "n4"));

    let stats = client.stats.snapshot();
    let cds = stats.of(CLUSTER).expect("cds stats");
    assert_eq!((cds.update_success, cds.update_rejected), (2, 0));
    assert_eq!(cds.status.version_text, "c2");
}

#[tokio::test]
async fn nack_keeps_the_last_accepted_version_and_names_the_refused() {
    let mut server = Server::start().await;
    let client = start_client(&server, Mode::StateOfTheWorld, Duration::from_millis(50));
    let mut stream = server.sotw_stream().await;
    stream.request().await;
    stream.respond(sotw_response(CLUSTER, "c1", "n1", &["a"]));
    stream.request().await; // EDS
    stream.request().await; // ACK

    client.sink.refuse("b", "unsupported field lb_policy");
    client.sink.refuse("c", "unknown filter");
    stream.respond(sotw_response(CLUSTER, "c2", "n2", &["a", "b", "c", "d"]));
    // The accepted part is applied (as Envoy's CDS does), and its endpoints asked for.
    let eds = stream.request().await;
    assert_eq!(eds.resource_names, names(&["a", "d"]));
    assert!(client.sink.held(CLUSTER).contains_key("d"));
    let nack = stream.request().await;
    assert_eq!(shape(&nack), (CLUSTER, "c1", "n2"));
    assert_eq!(
        nack_message(&nack),
        "Error adding/updating cluster(s) b: unsupported field lb_policy, c: unknown filter"
    );

    // The next good push is ACKed with its own version.
    stream.respond(sotw_response(CLUSTER, "c3", "n3", &["a"]));
    let eds = stream.request().await;
    assert_eq!(eds.resource_names, names(&["a"]));
    let ack = stream.request().await;
    assert_eq!(shape(&ack), (CLUSTER, "c3", "n3"));
    assert!(ack.error_detail.is_none());

    // Listeners are worded as Envoy's LDS words them.
    stream.respond(sotw_response(ENDPOINT, "e1", "n4", &["a"]));
    assert_eq!(stream.request().await.type_url, LISTENER);
    assert_eq!(shape(&stream.request().await), (ENDPOINT, "e1", "n4"));
    client.sink.refuse("l2", "filter ext_authz: not supported");
    client.sink.refuse("l3", "HBONE");
    stream.respond(sotw_response(LISTENER, "l1", "n5", &["l1", "l2", "l3"]));
    let rds = stream.request().await;
    assert_eq!(rds.resource_names, names(&["routes-l1"]));
    let nack = stream.request().await;
    assert_eq!(shape(&nack), (LISTENER, "", "n5"));
    assert_eq!(
        nack_message(&nack),
        "Error adding/updating listener(s) l2: filter ext_authz: not supported\nl3: HBONE\n"
    );

    let stats = client.stats.snapshot();
    let cds = stats.of(CLUSTER).expect("cds stats");
    assert_eq!((cds.update_success, cds.update_rejected), (2, 1));
    assert!(
        cds.status.last_error.is_none(),
        "cleared by the later success"
    );
    let lds = stats.of(LISTENER).expect("lds stats");
    assert_eq!(lds.update_rejected, 1);
    assert_eq!(
        lds.status.last_error.as_ref().map(|e| e.version.as_str()),
        Some("l1")
    );
}

#[tokio::test]
async fn malformed_resources_refuse_the_whole_response() {
    let mut server = Server::start().await;
    let client = start_client(&server, Mode::StateOfTheWorld, Duration::from_millis(50));
    let mut stream = server.sotw_stream().await;
    stream.request().await;
    stream.respond(sotw_response(CLUSTER, "c1", "n1", &["a"]));
    stream.request().await;
    stream.request().await;
    let applies = client
        .sink
        .applies
        .load(std::sync::atomic::Ordering::SeqCst);

    let mut response = sotw_response(CLUSTER, "c2", "n2", &["b"]);
    response.resources.push(Any {
        type_url: CLUSTER.to_owned(),
        value: vec![0x0a, 0xff, 0xff],
    });
    stream.respond(response);
    let nack = stream.request().await;
    assert_eq!(shape(&nack), (CLUSTER, "c1", "n2"));
    let message = nack_message(&nack);
    assert!(
        message.contains("resource [1] cannot be decoded"),
        "{message}"
    );
    // Nothing of it reached the sink: "a", held, is not removed by a set we could not read.
    assert_eq!(
        client
            .sink
            .applies
            .load(std::sync::atomic::Ordering::SeqCst),
        applies
    );
    assert!(client.sink.held(CLUSTER).contains_key("a"));

    let mut response = sotw_response(CLUSTER, "c3", "n3", &["b"]);
    response.resources.push(any(LISTENER, "x"));
    stream.respond(response);
    let nack = stream.request().await;
    assert_eq!(shape(&nack), (CLUSTER, "c1", "n3"));
    assert!(nack_message(&nack).contains("does not match the message-wide type URL"));

    // A resource wrapped in envoy.service.discovery.v3.Resource is read through.
    let wrapped = Wrapped {
        name: "w".to_owned(),
        resource: Some(any(CLUSTER, "w")),
        ..Wrapped::default()
    };
    let mut response = sotw_response(CLUSTER, "c4", "n4", &[]);
    response.resources.push(Any {
        type_url: "type.googleapis.com/envoy.service.discovery.v3.Resource".to_owned(),
        value: prost::Message::encode_to_vec(&wrapped),
    });
    stream.respond(response);
    assert_eq!(stream.request().await.resource_names, names(&["w"]));
    assert_eq!(shape(&stream.request().await), (CLUSTER, "c4", "n4"));
    assert!(client.sink.held(CLUSTER).contains_key("w"));
}

#[tokio::test]
async fn reconnects_with_the_last_accepted_versions_and_no_stale_nonce() {
    let mut server = Server::start().await;
    let client = start_client(&server, Mode::StateOfTheWorld, Duration::from_millis(100));
    let mut stream = server.sotw_stream().await;
    stream.request().await;
    stream.respond(sotw_response(CLUSTER, "c1", "n1", &["a"]));
    stream.request().await;
    stream.request().await;
    stream.respond(sotw_response(ENDPOINT, "e1", "n2", &["a"]));
    stream.request().await;
    stream.request().await; // LDS
    drop(stream);

    let mut stream = server.sotw_stream().await;
    let cds = stream.request().await;
    assert_eq!(shape(&cds), (CLUSTER, "c1", ""));
    assert!(cds.node.is_some());
    let eds = stream.request().await;
    assert_eq!(shape(&eds), (ENDPOINT, "e1", ""));
    assert_eq!(eds.resource_names, names(&["a"]));
    let lds = stream.request().await;
    assert_eq!(shape(&lds), (LISTENER, "", ""));
    assert!(
        client.sink.held(CLUSTER).contains_key("a"),
        "the config stays in force"
    );
    assert_eq!(
        client
            .metadata_calls
            .load(std::sync::atomic::Ordering::SeqCst),
        2
    );
}
