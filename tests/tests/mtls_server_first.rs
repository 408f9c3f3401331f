//! A server that speaks first, behind a PERMISSIVE sidecar, reached from a client pod whose
//! sidecar originates mutual TLS: its greeting must cross the veth inside mesh TLS. What
//! crosses is read with tcpdump.

use remora_e2e::mesh::{client_config, handshakes, permissive_server, pods_to_sniff, SERVER_ID};
use remora_e2e::peer::{self, any_addr, Server};
use remora_e2e::sniff::{self, Sniffer};
use std::io::{Read, Write};
use std::time::Duration;

/// Bound on one client exchange.
const CLIENT_TIME: Duration = Duration::from_secs(20);

/// A server that speaks first (SMTP's shape) on a port nobody declared, behind a PERMISSIVE
/// sidecar: its greeting reaches the client inside mesh TLS, never in the clear, once the
/// client's sidecar has given up waiting for the client to speak.
#[test]
fn a_server_that_speaks_first_crosses_the_mesh_inside_mutual_tls() {
    let Some(net) = pods_to_sniff() else {
        return;
    };
    const BANNER: &[u8] = b"220 remora-e2e banner-5d2a ready\r\n";
    const PORT: u16 = 2528;
    let (server, client_dir) = permissive_server(&net);
    let client_yaml = format!(
        "{}detection:\n  timeout: 1s\n",
        client_config(&client_dir, net.pod_ip, SERVER_ID)
    );
    let client = net.peer_remora().config(&client_yaml).start_ready();
    let _app = Server::start(&net.pod, any_addr(PORT), |mut stream| {
        stream.write_all(BANNER)?;
        let mut buf = [0u8; 256];
        let n = stream.read(&mut buf)?;
        stream.write_all(&buf[..n])
    });
    let sniffer = Sniffer::start(&net.peer, "eth0", "tcp");

    let mut stream = peer::connect(&net.peer, net.pod_addr(PORT)).expect("connect");
    stream
        .set_read_timeout(Some(CLIENT_TIME))
        .expect("a read timeout");
    let mut got = vec![0u8; BANNER.len()];
    stream.read_exact(&mut got).unwrap_or_else(|e| {
        panic!(
            "no banner ({e})\nclient sidecar:\n{}\nserver sidecar:\n{}",
            client.stderr(),
            server.stderr()
        )
    });
    assert_eq!(got, BANNER);
    stream.write_all(b"HELO remora\r\n").expect("write");
    let mut echo = vec![0u8; 13];
    stream
        .read_exact(&mut echo)
        .expect("the echo after the banner");
    assert_eq!(echo, b"HELO remora\r\n");
    drop(stream);

    let wire = sniffer.stop();
    assert!(
        !sniff::contains(&wire, b"banner-5d2a"),
        "the greeting crossed the wire in the clear"
    );
    assert!(
        sniff::contains(&wire, b"istio-peer-exchange"),
        "no mesh ClientHello in {} captured bytes\nclient sidecar:\n{}",
        wire.len(),
        client.stderr()
    );
    assert!(handshakes(&client, "outbound", "ok") >= 1.0);
}
