use super::*;
use crate::tls::test_certs::Ca;

#[test]
fn spiffe_ids_split_into_istios_parts() {
    let id = SpiffeId::parse("spiffe://cluster.local/ns/bookinfo/sa/reviews").unwrap();
    assert_eq!(id.trust_domain(), "cluster.local");
    assert_eq!(id.namespace(), Some("bookinfo"));
    assert_eq!(id.service_account(), Some("reviews"));
    assert!(SpiffeId::parse("https://example.com").is_none());
    assert!(SpiffeId::parse("spiffe:///ns/x").is_none());
    let bare = SpiffeId::parse("spiffe://example.org").unwrap();
    assert_eq!(bare.namespace(), None);
}

fn write(dir: &Path, chain: &str, key: &str, roots: &str) {
    std::fs::write(dir.join("cert-chain.pem"), chain).unwrap();
    std::fs::write(dir.join("key.pem"), key).unwrap();
    std::fs::write(dir.join("root-cert.pem"), roots).unwrap();
}

fn paths(dir: &Path) -> Paths {
    Paths::from_config(&TlsConfig {
        cert_dir: Some(dir.to_path_buf()),
        ..TlsConfig::default()
    })
    .unwrap()
}

#[test]
fn loads_istios_layout_and_reads_the_spiffe_id() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("mesh");
    let (chain, key) = ca.workload("spiffe://cluster.local/ns/default/sa/sleep", false);
    write(dir.path(), &chain, &key, &ca.cert.pem());
    let p = paths(dir.path());
    let id = Identity::load(&p, &p.read().unwrap()).unwrap();
    assert_eq!(
        id.spiffe_id.as_str(),
        "spiffe://cluster.local/ns/default/sa/sleep"
    );
    assert_eq!(id.chain.len(), 1);
    assert_eq!(id.ca.len(), 1);
    assert!(id.not_after() > SystemTime::now());
}

#[test]
fn a_mismatched_key_or_a_certificate_without_spiffe_id_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("mesh");
    let (chain, _) = ca.workload("spiffe://cluster.local/ns/a/sa/b", false);
    let (_, other_key) = ca.workload("spiffe://cluster.local/ns/a/sa/b", false);
    write(dir.path(), &chain, &other_key, &ca.cert.pem());
    let p = paths(dir.path());
    let err = Identity::load(&p, &p.read().unwrap()).unwrap_err();
    assert!(err.to_string().contains("key.pem"), "{err}");
    let (chain, key) = ca.workload("https://not-spiffe.example", false);
    write(dir.path(), &chain, &key, &ca.cert.pem());
    let err = Identity::load(&p, &p.read().unwrap()).unwrap_err();
    assert!(err.to_string().contains("SPIFFE"), "{err}");
    write(dir.path(), &chain, &key, "");
    assert!(Identity::load(&p, &p.read().unwrap()).is_err());
}

#[test]
fn the_watcher_swaps_in_a_rotation_and_keeps_the_old_one_through_a_half_written_one() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("mesh");
    let id = "spiffe://cluster.local/ns/default/sa/sleep";
    let (chain, key) = ca.workload(id, false);
    write(dir.path(), &chain, &key, &ca.cert.pem());
    let store = Arc::new(Store::default());
    let mut watcher = Watcher::start(
        paths(dir.path()),
        Arc::clone(&store),
        Duration::from_secs(1),
    )
    .unwrap();
    let metrics = crate::metrics::TlsMetrics::default();
    let first = store.current().unwrap();
    watcher.check(&metrics);
    assert!(
        Arc::ptr_eq(&first, &store.current().unwrap()),
        "unchanged files reload nothing"
    );
    assert!(metrics.cert_expiry_seconds().is_some_and(|s| s > 0));

    // Half-written: a new certificate next to the old key.
    let (chain2, key2) = ca.workload(id, false);
    std::fs::write(dir.path().join("cert-chain.pem"), &chain2).unwrap();
    watcher.check(&metrics);
    assert!(Arc::ptr_eq(&first, &store.current().unwrap()));
    assert_eq!(metrics.load_failures.get(), 1);
    watcher.check(&metrics);
    assert_eq!(
        metrics.load_failures.get(),
        1,
        "the same broken set is reported once"
    );

    std::fs::write(dir.path().join("key.pem"), &key2).unwrap();
    watcher.check(&metrics);
    let second = store.current().unwrap();
    assert!(!Arc::ptr_eq(&first, &second));
    assert_ne!(first.chain[0].serial, second.chain[0].serial);
    assert_eq!(metrics.rotations.get(), 1);
}

/// Wait (bounded) for `store` to hold something other than `old`.
async fn replaced(store: &Store, old: &Arc<Identity>) -> Option<Arc<Identity>> {
    for _ in 0..100 {
        let now = store.current()?;
        if !Arc::ptr_eq(&now, old) {
            return Some(now);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test]
async fn a_secret_volumes_data_swap_is_seen_by_the_watch_not_a_poll() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("mesh");
    let id = "spiffe://cluster.local/ns/default/sa/sleep";
    let roots = ca.cert.pem();
    let set = |chain: &str, key: &str| {
        [
            ("cert-chain.pem", chain.to_string()),
            ("key.pem", key.to_string()),
            ("root-cert.pem", roots.clone()),
        ]
    };
    let publish = |generation, files: &[(&str, String); 3]| {
        let files: Vec<(&str, &str)> = files.iter().map(|(n, c)| (*n, c.as_str())).collect();
        crate::file_watch::publish_atomically(dir.path(), generation, &files);
    };
    let (chain, key) = ca.workload(id, false);
    publish(1, &set(&chain, &key));
    let store = Arc::new(Store::default());
    // An hour between polls: only the watch can see a change within the test's bound.
    let watcher = Watcher::start(
        paths(dir.path()),
        Arc::clone(&store),
        Duration::from_secs(3600),
    )
    .unwrap();
    assert!(watcher.is_watching());
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let task = tokio::spawn(watcher.watch(Arc::clone(&metrics)));
    let first = store.current().unwrap();

    let (chain2, key2) = ca.workload(id, false);
    publish(2, &set(&chain2, &key2));
    let second = replaced(&store, &first)
        .await
        .expect("the swapped certificate was not loaded");
    assert_ne!(first.chain[0].serial, second.chain[0].serial);
    assert_eq!(metrics.tls.rotations.get(), 1);

    // A key that is not the certificate's: refused, the running one stays.
    let (_, wrong_key) = ca.workload(id, false);
    let (chain3, _) = ca.workload(id, false);
    publish(3, &set(&chain3, &wrong_key));
    for _ in 0..100 {
        if metrics.tls.load_failures.get() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metrics.tls.load_failures.get(), 1);
    assert!(Arc::ptr_eq(&second, &store.current().unwrap()));

    // Mended: the next swap is loaded.
    let (chain4, key4) = ca.workload(id, false);
    publish(4, &set(&chain4, &key4));
    let fourth = replaced(&store, &second)
        .await
        .expect("the mended certificate was not loaded");
    assert_ne!(fourth.chain[0].serial, second.chain[0].serial);
    task.abort();
}
