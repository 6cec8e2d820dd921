//! Blob collection without listing every blob: a pass checks the blobs
//! written or freed since the last one; a full listing runs at the first
//! pass after start (what a crash left behind) and once a day.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln::store::{BlobStore, BlobUpload, DiskBlobs, SledMeta, StoreError};
use serde_json::Value;

use super::{TestServer, png_bytes};

/// The embedded blob store, counting full listings.
struct CountingBlobs {
    inner: DiskBlobs,
    lists: AtomicUsize,
}

impl BlobStore for CountingBlobs {
    fn usage(&self) -> Result<kiln::store::BlobUsage, StoreError> {
        self.inner.usage()
    }
    fn put(&self, data: &[u8]) -> Result<blake3::Hash, StoreError> {
        self.inner.put(data)
    }
    fn begin(&self, limit: u64) -> Result<BlobUpload, StoreError> {
        self.inner.begin(limit)
    }
    fn commit(&self, upload: BlobUpload) -> Result<(blake3::Hash, u64), StoreError> {
        self.inner.commit(upload)
    }
    fn contains(&self, hash: &blake3::Hash) -> Result<bool, StoreError> {
        self.inner.contains(hash)
    }
    fn open(&self, hash: &blake3::Hash) -> Result<Option<std::fs::File>, StoreError> {
        self.inner.open(hash)
    }
    fn delete(&self, hash: &blake3::Hash) -> Result<(), StoreError> {
        self.inner.delete(hash)
    }
    fn list(&self) -> Result<Vec<blake3::Hash>, StoreError> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.inner.list()
    }
}

async fn upload(s: &TestServer, bytes: Vec<u8>) -> Value {
    let form = reqwest::multipart::Form::new().text("file_path", "t.png").part("file", reqwest::multipart::Part::bytes(bytes).file_name("t.png"));
    let r = s.http.post(s.url("/assets")).multipart(form).send().await.unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert_eq!(status, 201, "{body}");
    body
}

#[tokio::test]
async fn a_pass_checks_only_blobs_written_or_freed_since_the_last() {
    let (mut counted, mut stray) = (None, None);
    let s = super::start_on_backends(|data| {
        let meta = Arc::new(SledMeta::open(&data.join("meta")).unwrap());
        let blobs = Arc::new(CountingBlobs { inner: DiskBlobs::open(data.join("blobs")).unwrap(), lists: AtomicUsize::new(0) });
        // A blob a crash left without a record.
        stray = Some(blobs.put(b"left by a crash").unwrap());
        counted = Some(blobs.clone());
        kiln::service::Backends::with_stores(meta, blobs, data).unwrap()
    })
    .await;
    let (blobs, stray, service) = (counted.unwrap(), stray.unwrap(), s.server.state.service.clone());
    // The sweeper's first pass runs at start.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while blobs.contains(&stray).unwrap() {
        assert!(std::time::Instant::now() < deadline, "the first pass collects what a crash left");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(blobs.lists.load(Ordering::SeqCst), 1, "the first pass lists every blob");

    let kept = upload(&s, png_bytes(4, 4, 1)).await;
    let freed = upload(&s, png_bytes(4, 4, 2)).await;
    let r = s.http.delete(s.url(&format!("/assets/{}", freed["id"].as_str().unwrap()))).send().await.unwrap();
    assert_eq!(r.status(), 204);
    let now = kiln::store::now_micros();
    service.sweep(now).await.unwrap();
    assert_eq!(blobs.lists.load(Ordering::SeqCst), 1, "later passes list nothing");
    let hash = |a: &Value| kiln::store::parse_blob_name(a["hash"].as_str().unwrap()).unwrap();
    assert!(!blobs.contains(&hash(&freed)).unwrap(), "the deleted asset's blob is collected");
    assert!(blobs.contains(&hash(&kept)).unwrap(), "a blob with a record stays");
    assert_eq!(s.get(&format!("/assets/{}", kept["id"].as_str().unwrap())).await.0, 200);
    // A stray written now waits for the next full pass (a day): no pass
    // before it looks at blobs nobody noted.
    let late = blobs.put(b"late stray").unwrap();
    service.sweep(now).await.unwrap();
    assert!(blobs.contains(&late).unwrap());
}
