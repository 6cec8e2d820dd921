//! A server whose blobs are in an S3 bucket (`blob_store = "s3"`), on a
//! SeaweedFS server of the test's own (`KILN_TEST_WEED`, the `weed` binary
//! `.ci/run` installs), so it can be stopped without disturbing the other
//! tests: while the bucket is away, uploads fail with 500
//! `upstream_error` and cached blobs still download; once it is back, a
//! host that lost its whole cache serves every asset from the bucket.

use kiln::config::BlobStoreKind;

use super::{png_bytes, start_in};
use crate::own_weed::OwnWeed;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_survive_the_bucket_going_away_and_a_lost_cache() {
    let Some(mut weed) = OwnWeed::start_new() else { return };
    let endpoint = weed.endpoint();
    let in_bucket = move |c: &mut kiln::config::Config, _: &mut kiln::service::ServiceOptions| {
        c.blob_store = BlobStoreKind::S3;
        c.s3_endpoint = Some(endpoint.clone());
        c.s3_bucket = Some("kiln-outage".into());
    };
    let s = start_in(tempfile::tempdir().unwrap(), in_bucket.clone()).await;
    let image = png_bytes(16, 16, 7);
    let (code, asset) = s.upload("kept.png", image.clone(), None).await;
    assert_eq!(code, 201, "{asset}");
    let content = format!("/assets/{}/content", asset["id"].as_str().unwrap());

    weed.stop();
    let (code, refused) = s.upload("refused.png", png_bytes(16, 16, 8), None).await;
    assert_eq!((code, refused["error"]["code"].as_str()), (500, Some("upstream_error")), "{refused}");
    let cached = s.http.get(s.url(&content)).send().await.unwrap();
    assert_eq!(cached.status(), 200, "a cached blob downloads while the bucket is away");
    assert_eq!(cached.bytes().await.unwrap(), image);

    weed.start();
    // A restarted SeaweedFS answers before its volume server has
    // registered again (reads fail meanwhile): wait until the blob reads.
    let hash = kiln::store::parse_blob_name(asset["hash"].as_str().unwrap()).unwrap();
    let probe = kiln::store::s3::S3Settings {
        endpoint: Some(weed.endpoint()),
        bucket: "kiln-outage".into(),
        region: "us-east-1".into(),
        cache_dir: weed.dir.path().join("probe-cache"),
        cache_bytes: 1 << 20,
        installation: None,
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let ready = match kiln::store::s3::S3Blobs::open(&probe).await {
            Ok(blobs) => tokio::task::spawn_blocking(move || kiln::store::BlobStore::open(&blobs, &hash).is_ok_and(|f| f.is_some())).await.unwrap(),
            Err(_) => false,
        };
        if ready {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the restarted SeaweedFS never served the blob");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    let data = s.shutdown().await;
    std::fs::remove_dir_all(data.path().join("blob-cache")).unwrap();
    let s = start_in(data, in_bucket).await;
    let fetched = s.http.get(s.url(&content)).send().await.unwrap();
    assert_eq!(fetched.status(), 200);
    assert_eq!(fetched.bytes().await.unwrap(), image, "read back from the bucket");
    let (code, again) = s.upload("refused.png", png_bytes(16, 16, 8), None).await;
    assert_eq!(code, 201, "uploads work again: {again}");
}

/// Two installations (each its own data directory, so its own records)
/// named one bucket: the second server does not start, naming the owner;
/// the first's restart does. On the shared S3 test server
/// (`KILN_TEST_S3_ENDPOINT`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_installation_on_a_bucket_does_not_start() {
    let Ok(endpoint) = std::env::var("KILN_TEST_S3_ENDPOINT") else {
        assert!(std::env::var_os("CI").is_none(), "CI must set KILN_TEST_S3_ENDPOINT");
        eprintln!("SKIPPED: KILN_TEST_S3_ENDPOINT is not set");
        return;
    };
    let bucket = format!("kiln-shared-{}", uuid::Uuid::new_v4().simple());
    let in_bucket = |c: &mut kiln::config::Config, _: &mut kiln::service::ServiceOptions| {
        c.store = kiln::config::StoreKind::Embedded;
        c.blob_store = BlobStoreKind::S3;
        c.s3_endpoint = Some(endpoint.clone());
        c.s3_bucket = Some(bucket.clone());
    };
    let first = start_in(tempfile::tempdir().unwrap(), in_bucket).await;
    let other = tempfile::tempdir().unwrap();
    let mut config = super::config(other.path());
    let mut options = kiln::service::ServiceOptions::from_config(&config);
    in_bucket(&mut config, &mut options);
    let env = super::env().await;
    let refused = kiln::server::Server::start_with(config, options, env.runtime.clone(), env.registry.clone()).await;
    let Err(e) = refused else { panic!("a second installation started on the bucket") };
    assert!(format!("{e:#}").contains("belongs to another kiln installation"), "{e:#}");
    let data = first.shutdown().await;
    let again = start_in(data, in_bucket).await;
    assert_eq!(again.get("/health").await.0, 200);
}
