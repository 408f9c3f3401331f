use super::*;
use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(5);

fn httpbin() -> WorkloadMetadata {
    WorkloadMetadata {
        namespace: "server".into(),
        workload: "httpbin".into(),
        app: "httpbin".into(),
        version: "v1".into(),
        ..WorkloadMetadata::default()
    }
}

/// Length-delimited protobuf field `number`: tag, varint length, bytes. Written out here from
/// the protobuf encoding rules, independently of the encoder under test.
fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![(number << 3) | 2];
    let mut len = bytes.len();
    loop {
        let low = (len & 0x7f) as u8;
        len >>= 7;
        if len == 0 {
            out.push(low);
            break;
        }
        out.push(low | 0x80);
    }
    out.extend_from_slice(bytes);
    out
}

/// google.protobuf.Struct from (key, Value bytes), keys in the order given.
fn structure(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    entries
        .iter()
        .flat_map(|(k, v)| field(1, &[field(1, k.as_bytes()), field(2, v)].concat()))
        .collect()
}

/// google.protobuf.Value holding a string (field 3) or a Struct (field 5).
fn string_value(s: &str) -> Vec<u8> {
    field(3, s.as_bytes())
}

fn struct_value(s: Vec<u8>) -> Vec<u8> {
    field(5, &s)
}

/// The header for [`httpbin`], built by hand from the documented format.
fn hand_built_header() -> Vec<u8> {
    let labels = structure(&[
        ("app", string_value("httpbin")),
        ("version", string_value("v1")),
    ]);
    let node = structure(&[
        ("LABELS", struct_value(labels)),
        ("NAMESPACE", string_value("server")),
        ("WORKLOAD_NAME", string_value("httpbin")),
    ]);
    let payload = structure(&[("x-envoy-peer-metadata", struct_value(node))]);
    let any = [
        field(1, b"type.googleapis.com/google.protobuf.Struct"),
        field(2, &payload),
    ]
    .concat();
    let mut frame = vec![0x3d, 0x23, 0x04, 0x67];
    frame.extend_from_slice(&(any.len() as u32).to_be_bytes());
    frame.extend_from_slice(&any);
    frame
}

/// The same header as Python's `google.protobuf` 7.36 (the reference implementation)
/// serialises it with `deterministic=True`, framed with `struct.pack(">II", …)`.
const PYTHON_PROTOBUF_HEADER: &str = "3d230467000000b00a2a747970652e676f6f676c65617069732e636f6d2f\
676f6f676c652e70726f746f6275662e5374727563741281010a7f0a15782d656e766f792d706565722d6d657461\
646174611266\
2a640a2f0a064c4142454c5312252a230a100a0361707012091a076874747062696e0a0f0a0776657273696f6e1204\
1a0276310a150a094e414d45535041434512081a067365727665720a1a0a0d574f524b4c4f41445f4e414d451209\
1a076874747062696e";

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn the_header_matches_the_documented_wire_format_byte_for_byte() {
    let encoded = wire::encode(&httpbin());
    assert_eq!(encoded, hand_built_header());
    assert_eq!(encoded, unhex(PYTHON_PROTOBUF_HEADER));
    assert_eq!(&encoded[..4], &0x3D23_0467u32.to_be_bytes());
}

#[test]
fn a_header_built_by_hand_decodes() {
    let frame = hand_built_header();
    let preamble: [u8; 8] = frame[..8].try_into().unwrap();
    let len = wire::payload_len(preamble).expect("magic");
    assert_eq!(len as usize, frame.len() - 8);
    let decoded = wire::decode(&frame[8..]).unwrap();
    assert_eq!(decoded, Some(httpbin()));
}

#[test]
fn qualified_labels_win_and_unknown_fields_are_ignored() {
    let labels = structure(&[
        ("app", string_value("short")),
        ("app.kubernetes.io/name", string_value("qualified")),
        ("service.istio.io/canonical-name", string_value("svc")),
        ("service.istio.io/canonical-revision", string_value("rev")),
        ("team", string_value("ignored")),
        ("version", string_value("v9")),
    ]);
    let node = structure(&[
        ("CLUSTER_ID", string_value("east")),
        ("LABELS", struct_value(labels)),
        ("NAME", string_value("pod-1")),
        (
            "OWNER",
            string_value("kubernetes://apis/apps/v1/namespaces/a/deployments/b"),
        ),
        ("PLATFORM_METADATA", struct_value(vec![])),
    ]);
    let payload = structure(&[
        ("x-envoy-peer-metadata", struct_value(node)),
        (
            "x-envoy-peer-metadata-id",
            string_value("sidecar~10.0.0.1~pod-1.a~a.svc"),
        ),
    ]);
    let any = [
        field(1, wire::STRUCT_TYPE_URL.as_bytes()),
        field(2, &payload),
    ]
    .concat();
    let m = wire::decode(&any).unwrap().unwrap();
    assert_eq!(m.app, "qualified");
    assert_eq!(m.version, "v9");
    assert_eq!(m.canonical_service, "svc");
    assert_eq!(m.canonical_revision, "rev");
    assert_eq!(m.cluster, "east");
    assert_eq!(m.instance, "pod-1");
    assert_eq!(m.workload, "");
}

#[test]
fn a_wrong_type_url_or_garbage_is_refused_and_no_metadata_is_none() {
    let any = [field(1, b"type.googleapis.com/x.Y"), field(2, b"")].concat();
    assert!(matches!(
        wire::decode(&any),
        Err(wire::DecodeError::TypeUrl(_))
    ));
    assert!(wire::decode(&[0xff, 0xff, 0xff]).is_err());
    let empty = [field(1, wire::STRUCT_TYPE_URL.as_bytes()), field(2, b"")].concat();
    assert_eq!(wire::decode(&empty).unwrap(), None);
    assert_eq!(wire::payload_len(*b"GET / HT"), None);
}

#[test]
fn our_metadata_leaves_out_what_is_unknown() {
    let own = Workload {
        name: "reviews-v2".into(),
        namespace: "bookinfo".into(),
        app: "reviews".into(),
        ..Workload::default()
    };
    let m = WorkloadMetadata::of(&own);
    assert_eq!(m.workload, "reviews-v2");
    assert_eq!(m.version, "");
    assert_eq!(m.canonical_revision, "latest");
    let decoded = wire::decode(&wire::encode(&m)[8..]).unwrap();
    assert_eq!(decoded, Some(m));
}

#[tokio::test]
async fn both_sides_learn_each_other_and_the_stream_follows_intact() {
    let (mut a, mut b) = duplex(64 * 1024);
    let client = WorkloadMetadata {
        workload: "sleep".into(),
        namespace: "client".into(),
        ..WorkloadMetadata::default()
    };
    let ours = LocalHeader(wire::encode(&client).into());
    let theirs = LocalHeader(wire::encode(&httpbin()).into());
    let (left, right) = tokio::join!(
        async {
            let got = exchange(&mut a, &ours, WAIT).await.unwrap();
            a.write_all(b"after the header").await.unwrap();
            got
        },
        exchange(&mut b, &theirs, WAIT)
    );
    assert_eq!(left.peer, Some(httpbin()));
    assert_eq!(right.unwrap().peer, Some(client));
    assert!(left.unread.is_empty());
    let mut rest = [0u8; 16];
    b.read_exact(&mut rest).await.unwrap();
    assert_eq!(&rest, b"after the header");
}

#[tokio::test]
async fn a_peer_that_does_not_speak_it_keeps_its_bytes() {
    let (mut a, mut b) = duplex(64 * 1024);
    b.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let got = exchange(&mut a, &LocalHeader::default(), WAIT)
        .await
        .unwrap();
    assert_eq!(got.peer, None);
    assert_eq!(&got.unread[..], b"GET / HT");
    let mut rest = [0u8; 10];
    a.read_exact(&mut rest).await.unwrap();
    assert_eq!(&rest, b"TP/1.1\r\n\r\n");
    // A peer that closes after three bytes: they are all it sent.
    let (mut a, mut b) = duplex(1024);
    b.write_all(b"abc").await.unwrap();
    b.shutdown().await.unwrap();
    let got = exchange(&mut a, &LocalHeader::default(), WAIT)
        .await
        .unwrap();
    assert_eq!(&got.unread[..], b"abc");
}

#[tokio::test]
async fn oversized_invalid_and_silent_peers_fail_within_bounds() {
    let (mut a, mut b) = duplex(64 * 1024);
    let mut big = 0x3D23_0467u32.to_be_bytes().to_vec();
    big.extend_from_slice(&(MAX_PAYLOAD as u32 + 1).to_be_bytes());
    b.write_all(&big).await.unwrap();
    let err = exchange(&mut a, &LocalHeader::default(), WAIT)
        .await
        .unwrap_err();
    assert!(matches!(err, ExchangeError::TooLarge(_)), "{err}");

    let (mut a, mut b) = duplex(64 * 1024);
    b.write_all(&[0x3d, 0x23, 0x04, 0x67, 0, 0, 0, 3, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    let err = exchange(&mut a, &LocalHeader::default(), WAIT)
        .await
        .unwrap_err();
    assert_eq!(err.as_str(), "invalid", "{err}");

    let (mut a, _b) = duplex(64 * 1024);
    let started = std::time::Instant::now();
    let err = exchange(&mut a, &LocalHeader::default(), Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(matches!(err, ExchangeError::Timeout(_)), "{err}");
    assert!(started.elapsed() < WAIT);
}

#[tokio::test]
async fn values_too_long_for_kubernetes_are_dropped() {
    let long = WorkloadMetadata {
        workload: "w".repeat(MAX_VALUE_LEN + 1),
        app: "fine".into(),
        ..WorkloadMetadata::default()
    };
    let (mut a, mut b) = duplex(64 * 1024);
    b.write_all(&wire::encode(&long)).await.unwrap();
    let got = exchange(&mut a, &LocalHeader::default(), WAIT)
        .await
        .unwrap();
    let peer = got.peer.unwrap();
    assert_eq!(peer.workload, "");
    assert_eq!(peer.app, "fine");
}
