//! The plan a scope follows, and a host following an in-memory shared
//! store: what it installs, keeps, removes, shares and refuses.

use super::*;

fn row(name: &str, manifest: &str, component: &str) -> SharedPlugin {
    SharedPlugin { scope: OPERATOR_SCOPE.into(), name: name.into(), manifest: manifest.into(), component: component.into() }
}

/// A plugin is installed when its revision is not the one marked here,
/// removed when marked and gone from the store, shared when never
/// marked, and a refused revision is not tried again.
#[test]
fn a_scope_is_planned_from_marks_and_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let (same, changed, gone, local) = (row("same", "m", "c1"), row("changed", "m2", "c2"), "gone", "local");
    for (name, revision) in [("same", Some(same.revision())), ("changed", Some(row("changed", "m1", "c2").revision())), (gone, Some("r".into())), (local, None)]
    {
        std::fs::create_dir(dir.path().join(name)).unwrap();
        if let Some(revision) = revision {
            mark(&dir.path().join(name), &revision).unwrap();
        }
    }
    let here: Vec<String> = ["same", "changed", gone, local].map(String::from).to_vec();
    let new = row("new", "m", "c3");
    let wanted = [same.clone(), changed.clone(), new.clone()];
    let plan = Plan::of(dir.path(), &here, &wanted, &HashMap::new());
    assert_eq!(plan, Plan { install: vec![changed.clone(), new.clone()], remove: vec![gone.into()], adopt: vec![local.into()] });
    // A marked folder whose plugin did not load here is installed again.
    let plan = Plan::of(dir.path(), &["changed".to_string()], std::slice::from_ref(&same), &HashMap::new());
    assert_eq!(plan.install, vec![same.clone()]);
    let refused = HashMap::from([((OPERATOR_SCOPE.to_string(), "new".to_string()), new.revision())]);
    assert_eq!(Plan::of(dir.path(), &here, &wanted, &refused).install, vec![changed.clone()], "a refused revision waits for a change");
    let newer = row("new", "m", "c4");
    assert_eq!(Plan::of(dir.path(), &here, std::slice::from_ref(&newer), &refused).install, vec![newer], "a changed one is tried");
    assert!(Plan::of(dir.path(), &["same".to_string()], &[same], &HashMap::new()).is_empty());
}

/// The store hosts share, in memory, counting its reads of plugins.
#[derive(Default)]
struct Memory {
    rows: parking_lot::Mutex<BTreeMap<(String, String), SharedPlugin>>,
    bytes: parking_lot::Mutex<HashMap<String, Vec<u8>>>,
    reads: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl SharedPlugins for Memory {
    async fn plugins(&self, scopes: Option<Vec<String>>) -> Result<Vec<SharedPlugin>, StoreError> {
        self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let rows = self.rows.lock();
        Ok(rows.values().filter(|r| scopes.as_ref().is_none_or(|s| s.contains(&r.scope))).cloned().collect())
    }

    async fn publish(&self, plugin: &SharedPlugin, component: &[u8], how: Publish) -> Result<Published, StoreError> {
        let mut rows = self.rows.lock();
        let key = (plugin.scope.clone(), plugin.name.clone());
        if rows.contains_key(&key) && !how.replace {
            return Ok(Published::Present);
        }
        let others = rows.keys().filter(|(scope, name)| *scope == plugin.scope && *name != plugin.name).count();
        if how.limit.is_some_and(|limit| others >= limit) {
            return Ok(Published::Full);
        }
        self.bytes.lock().insert(plugin.component.clone(), component.to_vec());
        rows.insert(key, plugin.clone());
        Ok(Published::Done)
    }

    async fn withdraw(&self, scope: &str, name: &str) -> Result<bool, StoreError> {
        Ok(self.rows.lock().remove(&(scope.to_string(), name.to_string())).is_some())
    }

    async fn component(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.bytes.lock().get(hash).cloned())
    }
}

/// `examples/custom-node` as built before (class `ExamplePosterize`).
const POSTERIZE: &[u8] = include_bytes!("../../../../tests/fixtures/plugins/custom-node-kiln-plugin-0.1.0.wasm");
const MANIFEST: &str = "name = \"example-posterize\"\nversion = \"1.0.0\"\ncomponent = \"plugin.wasm\"\n";

/// The same component with an empty custom section appended: another build.
fn another_build() -> Vec<u8> {
    let mut bytes = POSTERIZE.to_vec();
    bytes.extend([0u8, 5, 4]);
    bytes.extend(b"kiln");
    bytes
}

fn shared_row(scope: &str, manifest: &str, component: &[u8]) -> SharedPlugin {
    SharedPlugin { scope: scope.into(), name: "example-posterize".into(), manifest: manifest.into(), component: blake3::hash(component).to_hex().to_string() }
}

/// A host with accounts (two plugins each at most) on `dir`, sharing `store`.
async fn host(dir: &Path, store: Option<Arc<Memory>>) -> LivePlugins {
    // The shared set-up loads on a runtime of its own: off this one.
    let (runtime, registry) = tokio::task::spawn_blocking(|| (crate::test_support::runtime().clone(), crate::test_support::registry().clone())).await.unwrap();
    let quota = super::super::AccountQuota { max_plugins: 2, gpu: false };
    let mut plugins = LivePlugins::open(runtime, registry, &dir.join("plugins"), Some((&dir.join("accounts"), quota))).await.unwrap();
    if let Some(store) = store {
        plugins.share(store);
    }
    plugins
}

/// The operator's `example-posterize` here: its hash.
fn served(plugins: &LivePlugins) -> Option<String> {
    plugins.list().into_iter().find(|p| p.name == "example-posterize").map(|p| p.hash)
}

fn reads(store: &Memory) -> usize {
    store.reads.load(std::sync::atomic::Ordering::SeqCst)
}

/// A host follows installs, upgrades and removals; a plan read before an
/// install through the host itself does not undo it; nothing is read
/// again when nothing differs; a refusal is forgotten once its plugin is
/// gone from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_follows_the_store_and_keeps_its_own_fresh_install() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Memory::default());
    let plugins = host(dir.path(), Some(store.clone())).await;
    let (v1, v2) = (shared_row(OPERATOR_SCOPE, MANIFEST, POSTERIZE), shared_row(OPERATOR_SCOPE, MANIFEST, &another_build()));
    store.publish(&v1, POSTERIZE, Publish { limit: None, replace: true }).await.unwrap();
    plugins.follow_shared(None).await.unwrap();
    assert_eq!(served(&plugins), Some(format!("blake3:{}", v1.component)));
    assert_eq!(mark_of(&dir.path().join("plugins/example-posterize")), Some(v1.revision()));

    // In step: a pass reads the plugins once, and nothing more.
    let before = reads(&store);
    plugins.follow_shared(None).await.unwrap();
    assert_eq!(reads(&store), before + 1);

    // An upgrade through this host; a follow planned from a read before
    // it (v1 wanted) reads again in its turn and keeps v2.
    plugins.install(MANIFEST, another_build()).await.unwrap();
    assert_eq!(store.rows.lock().values().next(), Some(&v2), "written to the store");
    plugins.follow_operator(&*store, std::slice::from_ref(&v1)).await.unwrap();
    assert_eq!(served(&plugins), Some(format!("blake3:{}", v2.component)), "not undone by a stale read");

    // A refusal of a plugin the store no longer has is forgotten on the
    // quick path too.
    plugins.refused.lock().insert((OPERATOR_SCOPE.to_string(), "gone".to_string()), "r".into());
    plugins.follow_shared(None).await.unwrap();
    assert!(plugins.refused.lock().is_empty());

    // Removed through another host.
    store.withdraw(OPERATOR_SCOPE, "example-posterize").await.unwrap();
    plugins.follow_shared(Some(vec![OPERATOR_SCOPE.into()])).await.unwrap();
    assert_eq!(served(&plugins), None);
}

/// A revision that does not load here is refused (not tried again until
/// it changes) and takes the one before it out; a plugin kept from before
/// the host shared a store is written there, unless the store has one of
/// its name, which then replaces it here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_revision_takes_the_old_one_out_and_kept_plugins_are_shared() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Memory::default());
    // Installed before the host shared a store: unmarked.
    host(dir.path(), None).await.install(MANIFEST, POSTERIZE.to_vec()).await.unwrap();
    let plugins = host(dir.path(), Some(store.clone())).await;
    plugins.follow_shared(None).await.unwrap();
    let kept = shared_row(OPERATOR_SCOPE, MANIFEST, POSTERIZE);
    assert_eq!(store.rows.lock().values().next(), Some(&kept), "shared");
    assert_eq!(mark_of(&dir.path().join("plugins/example-posterize")), Some(kept.revision()));

    // A revision whose component is not a component.
    let broken = shared_row(OPERATOR_SCOPE, MANIFEST, b"not wasm");
    store.publish(&broken, b"not wasm", Publish { limit: None, replace: true }).await.unwrap();
    plugins.follow_shared(None).await.unwrap();
    assert_eq!(served(&plugins), None, "the old version is out");
    assert_eq!(plugins.refused.lock().get(&(OPERATOR_SCOPE.to_string(), "example-posterize".to_string())), Some(&broken.revision()));
    let before = reads(&store);
    plugins.follow_shared(None).await.unwrap();
    assert_eq!(reads(&store), before + 1, "not tried again");

    // An account's own plugin kept here, while the store has another of its
    // name: the store's wins.
    let other = tempfile::tempdir().unwrap();
    host(other.path(), None).await.install_for("acct", MANIFEST, POSTERIZE.to_vec()).await.unwrap();
    let theirs = shared_row("acct", MANIFEST, &another_build());
    store.publish(&theirs, &another_build(), Publish { limit: None, replace: true }).await.unwrap();
    let second = host(other.path(), Some(store.clone())).await;
    second.follow_shared(None).await.unwrap();
    assert_eq!(second.list_for("acct").unwrap()[0].hash, format!("blake3:{}", theirs.component));
    assert_eq!(store.rows.lock().get(&("acct".to_string(), "example-posterize".to_string())), Some(&theirs), "not replaced");
}
