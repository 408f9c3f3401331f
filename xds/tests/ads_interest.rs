//! The ADS client follows interest that changes with no response to apply (a cluster whose
//! endpoints' initial fetch timed out now wants its secrets, `Sink::interest`): the
//! subscription goes out at once, in delta and in state of the world alike.

mod ads_support;

use std::time::Duration;

use ads_support::*;
use remora_xds::ads::Mode;
use remora_xds::sink::type_url::{CLUSTER, ENDPOINT, SECRET};

#[tokio::test]
async fn delta_subscribes_to_secrets_wanted_between_responses() {
    let mut server = Server::start().await;
    let client = start_client(&server, Mode::Delta, Duration::from_millis(50));
    let mut stream = server.delta_stream().await;
    assert_eq!(stream.request().await.type_url, CLUSTER);
    stream.respond(delta_response(
        CLUSTER,
        "n1",
        vec![delta_resource(CLUSTER, "tls-a", "1")],
        &[],
    ));
    assert_eq!(stream.request().await.type_url, ENDPOINT);
    assert_eq!(stream.request().await.response_nonce, "n1");
    assert!(
        stream.quiet_for(Duration::from_millis(200)).await,
        "nothing more until the endpoints come"
    );

    // The endpoints never come; their wait times out in the sink, which wants the secret.
    client.sink.want(SECRET, &["secret-tls-a"]);
    let sds = stream.request().await;
    assert_eq!(
        (sds.type_url.as_str(), sds.resource_names_subscribe),
        (SECRET, names(&["secret-tls-a"]))
    );
    assert!(
        sds.response_nonce.is_empty(),
        "a subscription, not an answer"
    );

    // Interest that goes is unsubscribed the same way; unchanged interest sends nothing.
    client.sink.want(SECRET, &[]);
    let sds = stream.request().await;
    assert_eq!(
        (sds.type_url.as_str(), sds.resource_names_unsubscribe),
        (SECRET, names(&["secret-tls-a"]))
    );
    client.sink.want(SECRET, &[]);
    assert!(stream.quiet_for(Duration::from_millis(200)).await);
}

#[tokio::test]
async fn sotw_subscribes_to_secrets_wanted_between_responses() {
    let mut server = Server::start().await;
    let client = start_client(&server, Mode::StateOfTheWorld, Duration::from_millis(50));
    let mut stream = server.sotw_stream().await;
    assert_eq!(stream.request().await.type_url, CLUSTER);
    stream.respond(sotw_response(CLUSTER, "c1", "n1", &["tls-a"]));
    assert_eq!(stream.request().await.type_url, ENDPOINT);
    assert_eq!(stream.request().await.response_nonce, "n1");
    assert!(
        stream.quiet_for(Duration::from_millis(200)).await,
        "nothing more until the endpoints come"
    );

    client.sink.want(SECRET, &["secret-tls-a"]);
    let sds = stream.request().await;
    assert_eq!(
        (sds.type_url.as_str(), sds.resource_names),
        (SECRET, names(&["secret-tls-a"]))
    );
    assert!(
        sds.response_nonce.is_empty(),
        "a subscription, not an answer"
    );
}
