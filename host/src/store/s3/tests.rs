//! The S3 store against a real S3-compatible server: the one
//! `KILN_TEST_S3_ENDPOINT` names, with the credentials in
//! `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (`.ci/run` starts
//! SeaweedFS on loopback). Without it these skip, except under CI, where
//! they fail. Each test makes buckets of its own.

use std::io::Read;

use super::*;
use crate::store::contract_blobs::{run_all, unique_bytes};

/// Settings for a new bucket (`bucket`: one already made) with its cache
/// in `dir`; `None` (skipped) when no server is configured outside CI.
fn settings(dir: &std::path::Path, bucket: Option<&str>, cache_bytes: u64) -> Option<S3Settings> {
    let Ok(endpoint) = std::env::var("KILN_TEST_S3_ENDPOINT") else {
        assert!(std::env::var_os("CI").is_none(), "CI must set KILN_TEST_S3_ENDPOINT (.ci/run starts SeaweedFS)");
        eprintln!("SKIPPED: KILN_TEST_S3_ENDPOINT is not set; .ci/run starts an S3 server");
        return None;
    };
    let bucket = bucket.map_or_else(|| format!("kiln-test-{}", uuid::Uuid::new_v4().simple()), str::to_string);
    Some(S3Settings { endpoint: Some(endpoint), bucket, region: "us-east-1".into(), cache_dir: dir.to_path_buf(), cache_bytes, installation: None })
}

fn read(blobs: &S3Blobs, hash: &blake3::Hash) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(mut file) = blobs.open(hash)? else { return Ok(None) };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

/// The blobs in a cache directory (not counting staged uploads).
fn cached_files(dir: &std::path::Path) -> usize {
    DiskBlobs::open(dir).unwrap().list().unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_keeps_the_blob_contract_in_a_bucket_it_creates() {
    let dir = tempfile::tempdir().unwrap();
    let Some(settings) = settings(dir.path(), None, 1 << 30) else { return };
    let blobs = S3Blobs::open(&settings).await.expect("the bucket is created");
    run_all(&blobs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_host_reads_a_blob_once_and_then_from_its_cache() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let Some(first) = settings(dir_a.path(), None, 1 << 30) else { return };
    let a = S3Blobs::open(&first).await.unwrap();
    let b = S3Blobs::open(&settings(dir_b.path(), Some(&first.bucket), 1 << 30).unwrap()).await.expect("an existing bucket opens");
    let data = unique_bytes("hosts", 300_000);
    let hash = a.put(&data).unwrap();
    assert_eq!(b.cached_bytes(), 0);
    assert!(b.contains(&hash).unwrap(), "host b sees host a's blob");
    assert_eq!(read(&b, &hash).unwrap().as_deref(), Some(&data[..]));
    assert_eq!((b.cached_bytes(), cached_files(dir_b.path())), (300_000, 1), "downloaded into b's cache");
    // Host b uploading the same bytes leaves one object.
    let mut upload = b.begin(1 << 20).unwrap();
    upload.write(&data).unwrap();
    assert_eq!(b.commit(upload).unwrap(), (hash, 300_000));
    assert_eq!(a.list().unwrap(), vec![hash]);
    // Gone from the bucket (behind b's back), b still serves its copy.
    let (store, key) = (a.store.clone(), object_key(&hash));
    a.runtime.run(async move { store.delete(&key).await.map_err(backend) }).await.unwrap();
    assert!(!a.exists(&hash).unwrap(), "the object is gone");
    assert_eq!(read(&b, &hash).unwrap().as_deref(), Some(&data[..]), "read from b's cache, not the bucket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_do_not_hash_to_their_key_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let Some(settings) = settings(dir.path(), None, 1 << 30) else { return };
    let blobs = S3Blobs::open(&settings).await.unwrap();
    let claimed = blake3::hash(b"what the key says");
    let (store, key) = (blobs.store.clone(), object_key(&claimed));
    blobs.runtime.run(async move { store.put(&key, PutPayload::from(&b"something else"[..])).await.map(drop).map_err(backend) }).await.unwrap();
    let err = read(&blobs, &claimed).expect_err("corrupt bytes are not served");
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    assert_eq!((blobs.cached_bytes(), cached_files(dir.path())), (0, 0), "nothing cached");
    assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0, "no staged file left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_cache_keeps_to_its_size_least_recently_used_first() {
    let dir = tempfile::tempdir().unwrap();
    const MIB: usize = 1 << 20;
    let Some(settings) = settings(dir.path(), None, 3 * MIB as u64) else { return };
    let blobs = S3Blobs::open(&settings).await.unwrap();
    let data: Vec<Vec<u8>> = (0..4).map(|i| unique_bytes(&format!("cache{i}"), MIB)).collect();
    let hashes: Vec<_> = data[..3].iter().map(|d| blobs.put(d).unwrap()).collect();
    // The first is used again, so the second is the least recently used
    // when the fourth arrives.
    assert_eq!(read(&blobs, &hashes[0]).unwrap().as_deref(), Some(&data[0][..]));
    let fourth = blobs.put(&data[3]).unwrap();
    assert_eq!((blobs.cached_bytes(), cached_files(dir.path())), (3 * MIB as u64, 3));
    let cached = |h: &blake3::Hash| blobs.cache.contains(h).unwrap();
    assert!(cached(&hashes[0]) && cached(&fourth) && !cached(&hashes[1]));
    // Evicted from the cache, still in the bucket: downloaded again.
    assert_eq!(read(&blobs, &hashes[1]).unwrap().as_deref(), Some(&data[1][..]));
    assert_eq!(blobs.cached_bytes(), 3 * MIB as u64);
    drop(blobs);
    // Reopened with a smaller cache, it is trimmed at once.
    let smaller = S3Settings { cache_bytes: MIB as u64, ..settings };
    let blobs = S3Blobs::open(&smaller).await.unwrap();
    assert_eq!((blobs.cached_bytes(), cached_files(dir.path())), (MIB as u64, 1));
    assert_eq!(blobs.list().unwrap().len(), 4, "the bucket keeps every blob");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_serves_one_installation() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let Some(first) = settings(dir_a.path(), None, 1 << 30) else { return };
    let mine = S3Settings { installation: Some("installation-a".into()), ..first };
    S3Blobs::open(&mine).await.expect("an unmarked bucket is marked");
    S3Blobs::open(&S3Settings { cache_dir: dir_b.path().to_path_buf(), ..mine.clone() }).await.expect("another host of the same installation");
    let theirs = S3Settings { installation: Some("installation-b".into()), cache_dir: dir_b.path().to_path_buf(), ..mine.clone() };
    let Err(refused) = S3Blobs::open(&theirs).await else { panic!("a second installation opened the bucket") };
    assert!(refused.to_string().contains("belongs to another kiln installation (installation-a)"), "{refused}");
    S3Blobs::open(&mine).await.expect("still the first installation's");
}
