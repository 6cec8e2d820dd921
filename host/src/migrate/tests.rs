//! What the end-to-end move (`host/tests/cluster/migrate.rs`) does not
//! reach: accounts, a damaged blob, a copy run again after it stopped part
//! way, and a database of another installation. On the PostgreSQL server
//! `KILN_TEST_DATABASE_URL` names (skipped without one, outside CI).

use std::sync::Arc;

use super::{MigrateError, Source, Target, run};
use crate::store::postgres::test_db::fresh;
use crate::store::{Account, AccountStore, BlobStore, DiskBlobs, SledMeta};

fn account(name: &str, credits: i64) -> Account {
    Account {
        id: format!("acct_{:032x}", credits),
        name: name.into(),
        key_hashes: vec![format!("{:064x}", credits)],
        credits,
        tier: "free".into(),
        subscription_active: true,
        disabled: false,
        created_at: 7,
    }
}

/// A data directory with two accounts, its server secrets and two blobs,
/// the second damaged on disk (its bytes no longer hash to its name).
async fn data_dir() -> (tempfile::TempDir, blake3::Hash) {
    let dir = tempfile::tempdir().unwrap();
    {
        let meta = SledMeta::open(&dir.path().join("meta")).unwrap();
        let accounts = meta.accounts().unwrap();
        accounts.create(&account("first", 10)).await.unwrap();
        accounts.create(&account("second", 20)).await.unwrap();
        let named = |id: &str, bytes: &[u8]| crate::store::contract::asset(id, None, &format!("blake3:{}", blake3::hash(bytes).to_hex()), None, &[]);
        crate::store::MetaStore::put_asset(&meta, &named("whole", b"kept whole")).await.unwrap();
        crate::store::MetaStore::put_asset(&meta, &named("damaged", b"damaged later")).await.unwrap();
        crate::store::MetaStore::flush(&meta).await.unwrap();
    }
    crate::secret_file::load_or_create(dir.path(), crate::accounts::keys::SECRET_FILE).unwrap();
    let blobs = DiskBlobs::open(dir.path().join("blobs")).unwrap();
    blobs.put(b"kept whole").unwrap();
    let damaged = blobs.put(b"damaged later").unwrap();
    std::fs::write(blobs.path(&damaged).unwrap(), b"not what was stored").unwrap();
    (dir, damaged)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_move_a_damaged_blob_stops_the_copy_and_a_second_run_finishes_it() {
    let Some(db) = fresh().await else { return };
    let (dir, damaged) = data_dir().await;
    let bucket = tempfile::tempdir().unwrap();
    let to: Arc<DiskBlobs> = Arc::new(DiskBlobs::open(bucket.path()).unwrap());
    let source = Source::open(dir.path()).unwrap();
    let target = Target::on(db.clone()).with_blobs(to.clone());

    let stopped = run(&source, &target, &mut |_| {}).await;
    match stopped {
        Err(MigrateError::Mismatch { kind: "blob", name, .. }) => assert_eq!(name, damaged.to_hex().as_str()),
        other => panic!("the damaged blob stops the copy: {other:?}"),
    }
    assert!(!to.contains(&damaged).unwrap(), "nothing stored under its name");
    assert!(!to.contains(&blake3::hash(b"not what was stored")).unwrap(), "nor under its bytes' hash");
    let moved = crate::store::postgres::PgAccounts::new(db.clone());
    assert_eq!(moved.get(&account("second", 20).id).await.unwrap(), Some(account("second", 20)), "accounts came over whole");

    // The operator removes the damaged file; the copy runs again.
    std::fs::remove_file(DiskBlobs::open(dir.path().join("blobs")).unwrap().path(&damaged).unwrap()).unwrap();
    let mut heard = Vec::new();
    let tallies = run(&source, &target, &mut |t| heard.push(t.kind)).await.unwrap();
    assert_eq!(heard, ["accounts", "deployments", "user files", "plugins", "blobs", "jobs", "assets", "idempotency claims"]);
    let of = |kind: &str| tallies.iter().find(|t| t.kind == kind).unwrap().clone();
    assert_eq!((of("accounts").source, of("accounts").copied, of("accounts").present), (2, 0, 2));
    assert_eq!((of("blobs").source, of("blobs").copied + of("blobs").present), (1, 1));
    assert!(to.contains(&blake3::hash(b"kept whole")).unwrap());
    let assets = of("assets");
    assert_eq!(
        (assets.source, assets.copied, assets.left_out, assets.left_out_ids.clone()),
        (2, 1, 1, vec!["damaged".to_string()]),
        "the asset whose blob is lost is left out, named"
    );
    assert!(assets.to_string().contains("1 left out (their blob is lost: damaged)"), "{assets}");
    assert!(!dir.path().join(super::MOVED_MARK).exists(), "a copy that left something out does not mark the directory");
}

/// A copy that left nothing out marks the directory: no embedded server
/// opens it again. A copy whose every asset lacks its blob (the wrong
/// bucket) is an error, not a copy with everything left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_copy_marks_the_directory_and_a_wrong_blob_store_is_an_error() {
    let Some(db) = fresh().await else { return };
    let (dir, damaged) = data_dir().await;
    std::fs::remove_file(DiskBlobs::open(dir.path().join("blobs")).unwrap().path(&damaged).unwrap()).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let wrong: Arc<DiskBlobs> = Arc::new(DiskBlobs::open(elsewhere.path()).unwrap());
    {
        // Assets checked against a blob store that has none of their blobs.
        let source = Source::open(dir.path()).unwrap();
        let missing = super::records::assets(&source, &Target::on(db.clone()), wrong).await;
        assert!(matches!(missing, Err(MigrateError::Mismatch { kind: "asset blobs", .. })), "{missing:?}");
    }
    let meta = SledMeta::open(&dir.path().join("meta")).unwrap();
    crate::store::MetaStore::delete_asset(&meta, &crate::store::MetaStore::get_asset(&meta, "damaged").await.unwrap().unwrap()).await.unwrap();
    crate::store::MetaStore::flush(&meta).await.unwrap();
    drop(meta);
    let source = Source::open(dir.path()).unwrap();
    run(&source, &Target::on(db), &mut |_| {}).await.unwrap();
    assert!(dir.path().join(super::MOVED_MARK).exists(), "the directory is marked as moved");
    drop(source);
    let refused = crate::service::Backends::embedded(dir.path(), crate::store::Durability::default()).err().expect("no embedded server opens it");
    assert!(refused.to_string().contains("kiln migrate"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_installations_database_is_refused_before_anything_is_copied() {
    use crate::api::signing::SECRET_FILE as SIGNING;
    use crate::store::MetaStore;
    let Some(db) = fresh().await else { return };
    let (dir, _) = data_dir().await;
    crate::secret_file::load_or_create(dir.path(), SIGNING).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    crate::secret_file::load_or_create(elsewhere.path(), SIGNING).unwrap();
    db.server_secret(SIGNING, elsewhere.path()).await.unwrap();
    let installation = crate::store::postgres::PgMeta::new(db.clone()).installation_id().await.unwrap();

    let source = Source::open(dir.path()).unwrap();
    let refused = run(&source, &Target::on(db.clone()), &mut |_| {}).await;
    assert!(matches!(refused, Err(MigrateError::ForeignSecret(ref name)) if name == SIGNING), "{refused:?}");
    assert_eq!(db.stored_secret(crate::accounts::keys::SECRET_FILE).await.unwrap(), None, "the other secret not seeded");
    assert_eq!(crate::store::postgres::PgMeta::new(db.clone()).installation_id().await.unwrap(), installation, "nor the installation's id taken");
    let accounts = crate::store::postgres::PgAccounts::new(db).all().await.unwrap();
    assert!(accounts.is_empty(), "nothing copied: {accounts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_database_takes_the_data_directorys_installation_id() {
    use crate::store::MetaStore;
    let Some(db) = fresh().await else { return };
    let (dir, damaged) = data_dir().await;
    std::fs::remove_file(DiskBlobs::open(dir.path().join("blobs")).unwrap().path(&damaged).unwrap()).unwrap();
    let source = Source::open(dir.path()).unwrap();
    let own = source.meta.installation_id().await.unwrap();
    run(&source, &Target::on(db.clone()), &mut |_| {}).await.unwrap();
    assert_eq!(crate::store::postgres::PgMeta::new(db).installation_id().await.unwrap(), own, "a bucket the server marked stays the installation's");
}

/// Installed plugins, the operator's and an account's own, come over by
/// scope and name with their components; a second run finds them there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installed_plugins_move_with_their_components() {
    use crate::store::cluster::{OPERATOR_SCOPE, SharedPlugins};
    let Some(db) = fresh().await else { return };
    let (dir, damaged) = data_dir().await;
    std::fs::remove_file(DiskBlobs::open(dir.path().join("blobs")).unwrap().path(&damaged).unwrap()).unwrap();
    let install = |folder: std::path::PathBuf, name: &str, bytes: &[u8]| {
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(folder.join("kiln-plugin.toml"), format!("name = \"{name}\"\nversion = \"1.0.0\"\ncomponent = \"p.wasm\"\n")).unwrap();
        std::fs::write(folder.join("p.wasm"), bytes).unwrap();
    };
    install(dir.path().join("plugins/ops-tool"), "ops-tool", b"operator component");
    let account_dir = dir.path().join("account-plugins/0123");
    install(account_dir.join("own-tool"), "own-tool", b"account component");
    std::fs::write(account_dir.join("account"), "acct_1").unwrap();
    let source = Source::open(dir.path()).unwrap();
    let target = Target::on(db.clone());
    let tallies = run(&source, &target, &mut |_| {}).await.unwrap();
    let plugins = tallies.iter().find(|t| t.kind == "plugins").unwrap();
    assert_eq!((plugins.source, plugins.copied), (2, 2));
    let moved = crate::store::postgres::PgPlugins::new(db.clone());
    let mut stored: Vec<(String, String)> = moved.plugins(None).await.unwrap().into_iter().map(|p| (p.scope, p.name)).collect();
    stored.sort();
    assert_eq!(stored, [(OPERATOR_SCOPE.to_string(), "ops-tool".to_string()), ("acct_1".to_string(), "own-tool".to_string())]);
    let hash = blake3::hash(b"account component").to_hex().to_string();
    assert_eq!(moved.component(&hash).await.unwrap().as_deref(), Some(&b"account component"[..]));
    let again = run(&source, &target, &mut |_| {}).await.unwrap();
    let plugins = again.iter().find(|t| t.kind == "plugins").unwrap();
    assert_eq!((plugins.source, plugins.copied, plugins.present), (2, 0, 2));
}
