use super::message::tests::query;
use super::*;
use std::time::Instant;
use tokio::net::{TcpListener, TcpStream, UdpSocket};

const SHORT: Duration = Duration::from_millis(300);

/// The answer a fake resolver gives: the query with QR set, `tc` as asked, and a marker tail
/// that lets a test see the bytes came through unchanged.
fn answer_to(query: &[u8], tc: bool) -> Vec<u8> {
    let mut a = query.to_vec();
    a[2] |= 0x80;
    if tc {
        a[2] |= 0x02;
    }
    a.extend_from_slice(b"\xC0\x0C-answer-tail");
    a
}

/// A UDP resolver on loopback that answers every query (with TC when `tc`).
async fn udp_resolver(tc: bool) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0; 65_535];
        while let Ok((n, from)) = socket.recv_from(&mut buf).await {
            let _ = socket.send_to(&answer_to(&buf[..n], tc), from).await;
        }
    });
    addr
}

/// A UDP socket that never answers: a resolver that is down without saying so.
async fn silent_resolver() -> (UdpSocket, SocketAddr) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

/// A TCP resolver on loopback that answers each length-prefixed query on a connection.
async fn tcp_resolver() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                while let Ok(Some(q)) = tcp::read_message(&mut s).await {
                    if tcp::write_message(&mut s, &answer_to(&q, false))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    addr
}

fn forwarder(upstreams: Vec<SocketAddr>) -> Arc<Forwarder> {
    Arc::new(Forwarder {
        names: None,
        upstreams,
        upstream_timeout: SHORT,
        metrics: DnsMetrics::default(),
    })
}

#[tokio::test]
async fn udp_answer_is_passed_back_byte_for_byte_truncation_included() {
    let f = forwarder(vec![udp_resolver(true).await]);
    let q = query(0x1234, "big.example.org");
    let answer = f.forward(&q, Transport::Udp).await.unwrap();
    assert_eq!(answer, answer_to(&q, true));
    assert!(message::is_truncated(&answer));
    assert_eq!(f.metrics.requests.get(), 1);
    assert_eq!(f.metrics.upstream_failures.get(), 0);
}

#[tokio::test]
async fn a_silent_resolver_times_out_and_the_next_one_answers() {
    let (_silent, silent) = silent_resolver().await;
    let f = forwarder(vec![silent, udp_resolver(false).await]);
    let q = query(7, "example.org");
    let started = Instant::now();
    let answer = f.forward(&q, Transport::Udp).await.unwrap();
    assert_eq!(answer, answer_to(&q, false));
    assert!(started.elapsed() >= SHORT);
    assert_eq!(f.metrics.upstream_requests.get(), 2);
    assert_eq!(f.metrics.upstream_failures.get(), 1);
}

#[tokio::test]
async fn no_resolver_answering_is_servfail_within_the_bound() {
    let (_silent, silent) = silent_resolver().await;
    // A closed port refuses at once (ICMP on the connected socket).
    let closed = {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let f = forwarder(vec![closed, silent]);
    let q = query(9, "nowhere.example");
    let started = Instant::now();
    let answer = f.forward(&q, Transport::Udp).await.unwrap();
    assert!(started.elapsed() < SHORT * 2 + Duration::from_millis(200));
    assert!(message::answers(&answer, 9));
    assert_eq!(answer[3] & 0x0F, 2, "SERVFAIL");
    assert_eq!(f.metrics.upstream_failures.get(), 2);
}

#[tokio::test]
async fn a_stray_datagram_is_not_taken_for_the_answer() {
    // The resolver first sends an answer with the wrong ID, then the right one.
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0; 512];
        if let Ok((n, from)) = socket.recv_from(&mut buf).await {
            let mut wrong = answer_to(&buf[..n], false);
            wrong[1] ^= 0xFF;
            let _ = socket.send_to(&wrong, from).await;
            let _ = socket.send_to(&answer_to(&buf[..n], false), from).await;
        }
    });
    let f = forwarder(vec![addr]);
    let q = query(0x0102, "a.example");
    assert_eq!(
        f.forward(&q, Transport::Udp).await.unwrap(),
        answer_to(&q, false)
    );
}

#[tokio::test]
async fn something_that_is_not_a_query_is_dropped() {
    let f = forwarder(vec![udp_resolver(false).await]);
    assert!(f.forward(b"hello", Transport::Udp).await.is_none());
    let answer = answer_to(&query(1, "x"), false);
    assert!(f.forward(&answer, Transport::Udp).await.is_none());
    assert_eq!(f.metrics.requests.get(), 0);
}

#[tokio::test]
async fn tcp_clients_get_length_prefixed_answers_in_order() {
    let f = forwarder(vec![tcp_resolver().await]);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = tcp::Limits {
        idle: Duration::from_secs(5),
        max_connections: 4,
    };
    tokio::spawn(tcp::serve(listener, Arc::clone(&f), limits));
    let mut client = TcpStream::connect(addr).await.unwrap();
    for id in [1u16, 2] {
        let q = query(id, "tcp.example.org");
        tcp::write_message(&mut client, &q).await.unwrap();
        let a = tcp::read_message(&mut client).await.unwrap().unwrap();
        assert_eq!(a, answer_to(&q, false));
    }
    assert_eq!(f.metrics.requests.get(), 2);
}

#[tokio::test]
async fn udp_queries_beyond_the_in_flight_bound_are_dropped() {
    let (_silent, silent) = silent_resolver().await;
    let f = forwarder(vec![silent]);
    let server = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(udp::serve(server, Arc::clone(&f), 1));
    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    client.send_to(&query(1, "a.example"), addr).await.unwrap();
    client.send_to(&query(2, "b.example"), addr).await.unwrap();
    // The first waits for its (silent) resolver and ends in SERVFAIL; the second was dropped.
    let mut buf = vec![0; 512];
    let (n, _) = tokio::time::timeout(Duration::from_secs(3), client.recv_from(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(message::answers(&buf[..n], 1));
    assert_eq!(f.metrics.dropped.get(), 1);
    assert!(
        tokio::time::timeout(SHORT * 2, client.recv_from(&mut buf))
            .await
            .is_err(),
        "the dropped query got an answer"
    );
}

/// A store holding a name table with one Kubernetes service of namespace `client`.
fn store_with_table() -> Arc<remora_xds::store::Store> {
    use prost::Message;
    use remora_xds::convert::name_table::{NameInfoProto, NameTableProto};
    use remora_xds::sink::{type_url, Resource, Sink, Update};
    let mut table = NameTableProto::default();
    table.table.insert(
        "reviews.client.svc.cluster.local".into(),
        NameInfoProto {
            ips: vec!["240.240.0.5".into()],
            registry: "Kubernetes".into(),
            shortname: "reviews".into(),
            namespace: "client".into(),
            alt_hosts: vec![],
        },
    );
    let store = Arc::new(remora_xds::store::Store::new());
    let applied = store.apply(
        type_url::NAME_TABLE,
        Update {
            resources: vec![Resource {
                name: String::new(),
                version: "1".into(),
                body: table.encode_to_vec(),
            }],
            removed: vec![],
            complete: true,
        },
    );
    assert!(applied.rejected.is_empty(), "{:?}", applied.rejected);
    store
}

fn names(store: Arc<remora_xds::store::Store>, awaits_table: bool) -> Names {
    let context = table::Context::new("client", "client.svc.cluster.local", &[]);
    Names::new(store, context, awaits_table)
}

#[tokio::test]
async fn mesh_names_are_answered_locally_the_rest_forwarded() {
    let f = Forwarder {
        names: Some(names(store_with_table(), true)),
        upstreams: vec![udp_resolver(false).await],
        upstream_timeout: SHORT,
        metrics: DnsMetrics::default(),
    };
    let q = query(0x4242, "reviews");
    let answer = f.forward(&q, Transport::Udp).await.unwrap();
    assert!(message::answers(&answer, 0x4242));
    assert_eq!(&answer[6..8], &[0, 1], "one record");
    assert_eq!(&answer[answer.len() - 4..], &[240, 240, 0, 5]);
    assert_eq!(f.metrics.upstream_requests.get(), 0, "not forwarded");
    let external = query(7, "www.example.org");
    assert_eq!(
        f.forward(&external, Transport::Udp).await.unwrap(),
        answer_to(&external, false)
    );
    assert_eq!(f.metrics.upstream_requests.get(), 1);
    assert_eq!(f.metrics.requests.get(), 2);
}

#[tokio::test]
async fn before_istiods_first_table_servfail_but_file_mode_forwards() {
    let empty = Arc::new(remora_xds::store::Store::new());
    let resolver = udp_resolver(false).await;
    let forwarder = |awaits| Forwarder {
        names: Some(names(Arc::clone(&empty), awaits)),
        upstreams: vec![resolver],
        upstream_timeout: SHORT,
        metrics: DnsMetrics::default(),
    };
    let q = query(3, "reviews");
    let istiod = forwarder(true);
    let answer = istiod.forward(&q, Transport::Udp).await.unwrap();
    assert_eq!(answer[3] & 0x0F, 2, "SERVFAIL");
    assert_eq!(istiod.metrics.upstream_requests.get(), 0);
    let files = forwarder(false);
    assert_eq!(
        files.forward(&q, Transport::Udp).await.unwrap(),
        answer_to(&q, false)
    );
}
