//! What both modes do with a response's resources: check each `Any`, hand the resources to the
//! sink, and word the NACK the way Envoy words it.
//!
//! Envoy's NACK (`error_detail`) is a `google.rpc.Status` with code 13 (INTERNAL), not
//! INVALID_ARGUMENT: both `GrpcMuxImpl` (state of the world) and `DeltaSubscriptionState` set
//! `WellKnownGrpcStatus::Internal`, and istiod logs it as `Internal:Error adding/updating
//! cluster(s) ...`. The message is the one Envoy's subscribers raise, truncated at 4096 bytes
//! with `...(truncated)` as Envoy's `truncateGrpcStatusMessage` does:
//! - CDS: `Error adding/updating cluster(s) a: why, b: why` (joined with `, `);
//! - LDS: `Error adding/updating listener(s) a: why\nb: why\n` (each followed by a newline);
//! - EDS and RDS: Envoy subscribes each name separately and reports the first failure only; we
//!   name every refused resource, `a: why, b: why`, so no failure is hidden.
//!
//! A response-level fault (a resource whose `Any` is of another type, a duplicate name) uses
//! Envoy's own wording for it and rejects the whole response.

use envoy_types::pb::google::rpc::Status;

use crate::sink::{type_url, Rejection};

/// `google.rpc.Code.INTERNAL`, the code Envoy puts in every NACK.
pub const NACK_CODE: i32 = 13;

/// Envoy's bound on an `error_detail` message (gRPC trailers are limited to 8 KiB).
const MAX_ERROR_MESSAGE: usize = 4096;

/// The message of a NACK refusing `rejected` resources of `type_url`.
pub fn rejection_message(type_url: &str, rejected: &[Rejection]) -> String {
    let entries = rejected.iter().map(|r| format!("{}: {}", r.name, r.reason));
    match type_url {
        type_url::CLUSTER => format!(
            "Error adding/updating cluster(s) {}",
            entries.collect::<Vec<_>>().join(", ")
        ),
        type_url::LISTENER => format!(
            "Error adding/updating listener(s) {}",
            entries.map(|e| e + "\n").collect::<String>()
        ),
        _ => entries.collect::<Vec<_>>().join(", "),
    }
}

/// The `error_detail` of a NACK carrying `message`.
pub fn error_detail(message: &str) -> Status {
    Status {
        code: NACK_CODE,
        message: truncate(message),
        details: Vec::new(),
    }
}

fn truncate(message: &str) -> String {
    if message.len() <= MAX_ERROR_MESSAGE {
        return message.to_owned();
    }
    let mut end = MAX_ERROR_MESSAGE;
    // Cut on a character boundary: a resource name or reason may be any UTF-8.
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...(truncated)", &message[..end])
}

/// The message Envoy's delta mux gives a resource whose `Any` is not of the response's type.
/// Envoy goes on with ` in DeltaDiscoveryResponse <the whole response as text>`; we leave the
/// response out: echoing megabytes back to the control plane helps no one reading the NACK.
pub fn delta_type_mismatch(resource_type: &str, response_type: &str) -> String {
    format!(
        "type URL {resource_type} embedded in an individual Any does not match the \
         message-wide type URL {response_type}"
    )
}

/// The same for Envoy's state-of-the-world mux, which words it differently (and also appends
/// the response, left out here for the same reason).
pub fn sotw_type_mismatch(resource_type: &str, response_type: &str) -> String {
    format!("{resource_type} does not match the message-wide type URL {response_type}")
}

/// The first field of every resource type a sidecar subscribes to is its name
/// (`Cluster.name`, `Listener.name`, `RouteConfiguration.name`,
/// `ClusterLoadAssignment.cluster_name`). Decoding only that field reads the name of a state of
/// the world resource without decoding it twice (the sink decodes it whole), while still
/// checking the body's framing: a body that is not a protobuf message fails here.
#[derive(Clone, PartialEq, prost::Message)]
struct Named {
    #[prost(string, tag = "1")]
    name: String,
}

/// The name of a serialised resource of `type_url`: one of the four sidecar types, or the
/// name table, which has no name field (its field 1 is the map) and is named "" as istiod
/// sends it; its framing is checked all the same.
pub fn resource_name(type_url: &str, body: &[u8]) -> Result<String, prost::DecodeError> {
    if type_url == type_url::NAME_TABLE {
        return <() as prost::Message>::decode(body).map(|()| String::new());
    }
    <Named as prost::Message>::decode(body).map(|n| n.name)
}

/// Checks the body's framing; see [`Named`].
pub fn check_body(type_url: &str, body: &[u8]) -> Result<(), prost::DecodeError> {
    resource_name(type_url, body).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejections() -> Vec<Rejection> {
        vec![
            Rejection {
                name: "a".to_owned(),
                reason: "no".to_owned(),
            },
            Rejection {
                name: "b".to_owned(),
                reason: "never".to_owned(),
            },
        ]
    }

    #[test]
    fn messages_follow_envoy() {
        assert_eq!(
            rejection_message(type_url::CLUSTER, &rejections()),
            "Error adding/updating cluster(s) a: no, b: never"
        );
        assert_eq!(
            rejection_message(type_url::LISTENER, &rejections()),
            "Error adding/updating listener(s) a: no\nb: never\n"
        );
        assert_eq!(
            rejection_message(type_url::ROUTE, &rejections()),
            "a: no, b: never"
        );
    }

    #[test]
    fn long_messages_are_truncated_like_envoy() {
        let long = "é".repeat(3000);
        let detail = error_detail(&long);
        assert_eq!(detail.code, 13);
        assert!(detail.message.ends_with("...(truncated)"));
        assert!(detail.message.len() <= MAX_ERROR_MESSAGE + "...(truncated)".len());
    }

    #[test]
    fn names_are_read_and_garbage_fails() {
        use envoy_types::pb::envoy::config::cluster::v3::Cluster;
        let body = prost::Message::encode_to_vec(&Cluster {
            name: "outbound|80||a".to_owned(),
            ..Cluster::default()
        });
        assert_eq!(
            resource_name(type_url::CLUSTER, &body).ok(),
            Some("outbound|80||a".to_owned())
        );
        assert!(resource_name(type_url::CLUSTER, &[0x0a, 0xff, 0x01]).is_err());
    }
}
