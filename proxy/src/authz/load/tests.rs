use super::*;
use crate::file_watch::publish_atomically;

const DENY_ADMIN: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
    metadata:\n  name: no-admin\n  namespace: server\nspec:\n  action: DENY\n  rules:\n  \
    - to:\n    - operation:\n        paths: [\"/admin\"]\n";
/// A port must be a number: refused, naming the field.
const BROKEN: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n\
    metadata:\n  name: broken\n  namespace: server\nspec:\n  action: DENY\n  rules:\n  \
    - to:\n    - operation:\n        ports: [\"http\"]\n";

/// A watcher of `dir` with an hour between polls: only the watch sees a change in time.
fn watcher(dir: &Path) -> Watcher {
    let mut config = Config::default();
    config.authorization.policy_dir = Some(dir.to_path_buf());
    config.authorization.watch_interval = Duration::from_secs(3600);
    Watcher::new(
        Arc::new(Authorizer::new(Default::default())),
        Arc::new(ArcSwap::from_pointee(config)),
        Arc::new(Store::default()),
        Workload {
            namespace: Some("server".into()),
            labels: BTreeMap::new(),
        },
    )
}

/// Wait (bounded) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..100 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within five seconds");
}

#[tokio::test]
async fn a_configmaps_data_swap_is_seen_by_the_watch_and_a_broken_one_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    publish_atomically(dir.path(), 1, &[]);
    let mut w = watcher(dir.path());
    w.load().expect("an empty directory loads");
    assert!(w.is_watching());
    let authorizer = Arc::clone(&w.authorizer);
    let task = tokio::spawn(w.watch());
    assert_eq!(authorizer.policies().counts.deny, 0);

    publish_atomically(dir.path(), 2, &[("deny.yaml", DENY_ADMIN)]);
    until("the DENY policy in force", || {
        authorizer.policies().counts.deny == 1
    })
    .await;
    assert_eq!(authorizer.metrics().reloads_ok.get(), 2);

    // A broken file beside it: the whole change is refused, the running set stays.
    publish_atomically(
        dir.path(),
        3,
        &[("deny.yaml", DENY_ADMIN), ("broken.yaml", BROKEN)],
    );
    until("the broken set refused", || {
        authorizer.metrics().reloads_failed.get() == 1
    })
    .await;
    assert_eq!(authorizer.policies().counts.deny, 1);

    // Mended, and the DENY policy removed: no policy in force.
    publish_atomically(dir.path(), 4, &[]);
    until("no policy in force", || {
        authorizer.policies().counts.deny == 0
    })
    .await;
    task.abort();
}

#[tokio::test]
async fn a_file_renamed_into_place_is_seen_by_the_watch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut w = watcher(dir.path());
    w.load().expect("an empty directory loads");
    let authorizer = Arc::clone(&w.authorizer);
    let task = tokio::spawn(w.watch());
    let tmp = dir.path().join(".deny.yaml.tmp");
    std::fs::write(&tmp, DENY_ADMIN).expect("write");
    std::fs::rename(&tmp, dir.path().join("deny.yaml")).expect("mv");
    until("the DENY policy in force", || {
        authorizer.policies().counts.deny == 1
    })
    .await;
    task.abort();
}
