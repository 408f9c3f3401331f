//! Checks of the harness itself: the veth pair, the peers, and cleanup on drop.

use remora_e2e::peer::{self, Server};
use remora_e2e::PodNet;
use std::path::Path;
use std::time::Duration;

#[test]
fn pod_and_peer_reach_each_other_over_the_veth_pair() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let server = Server::http(&net.peer, net.peer_addr(8080), "hello\n");
    let out = peer::curl(
        &net.pod,
        &[&format!("http://{}/", server.addr())],
        Duration::from_secs(5),
    );
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    assert_eq!(server.peers()[0].ip(), net.pod_ip);

    let echo = Server::echo(&net.pod, net.pod_addr(9000));
    let data = peer::pattern(100_000);
    let back = peer::echo_exchange(&net.peer, echo.addr(), &data).expect("echo");
    peer::assert_same_bytes("echo", &data, &back);
}

#[test]
fn dropping_the_pod_net_kills_remora_and_deletes_both_namespaces() {
    let Some(net) = PodNet::create_or_skip() else {
        return;
    };
    let names = [net.pod.name().to_string(), net.peer.name().to_string()];
    let remora = net.remora().start_ready();
    let pid = remora.pid();

    drop(remora);
    drop(net);

    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "remora (PID {pid}) outlived its handle"
    );
    for name in names {
        assert!(
            !Path::new("/var/run/netns").join(&name).exists(),
            "namespace {name} left behind"
        );
    }
}
