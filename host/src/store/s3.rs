//! Blobs in an S3-compatible bucket (AWS S3, Cloudflare R2, SeaweedFS,
//! MinIO…) through `object_store`, shared by every host that names the
//! bucket. A blob is the object `blobs/<blake3 hex>`: stored once whoever
//! writes it (a node's output already there is not sent again; an upload
//! replaces the object with the same bytes, so its timing tells nothing),
//! and two hosts writing one key at once is harmless.
//!
//! Readers get a local file: a blob is downloaded once into a cache under
//! the host's data directory, its hash checked on the way in, and the least
//! recently used cached blobs are removed once the cache holds more than its
//! size. Uploads are staged in that cache, sent in one request up to
//! [`PART_BYTES`] or as a multipart upload above it, and stay cached.

use std::collections::VecDeque;
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AwsAuthorizer};
use object_store::client::HttpRequestBody;
use object_store::path::Path as Key;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use parking_lot::Mutex;

use super::io_runtime::IoRuntime;
use super::{BlobStore, BlobUpload, DiskBlobs, StoreError, wait};

/// Where the bucket is (`blob_store = "s3"`); credentials come from the
/// standard `AWS_*` environment (keys, session token, or the instance's
/// role).
#[derive(Debug, Clone)]
pub struct S3Settings {
    /// The service's URL (`http://127.0.0.1:8333`,
    /// `https://<account>.r2.cloudflarestorage.com`); `None`: AWS S3 in
    /// `region`.
    pub endpoint: Option<String>,
    /// The bucket, created when missing.
    pub bucket: String,
    pub region: String,
    /// The local cache of blobs read or written on this host.
    pub cache_dir: PathBuf,
    /// Most bytes the cache keeps (the blob just read or written is kept
    /// even when larger).
    pub cache_bytes: u64,
    /// The installation the bucket must belong to (its record store's
    /// [`installation_id`](super::MetaStore::installation_id)): a bucket
    /// marked for another is refused, an unmarked one is marked. `None`:
    /// not checked.
    pub installation: Option<String>,
}

/// The object naming the installation a bucket belongs to.
const OWNER_KEY: &str = "kiln-installation";
/// The most bytes of that object read.
const MAX_OWNER_BYTES: u64 = 256;

/// Blob objects live under this prefix (the bucket may hold other things).
const PREFIX: &str = "blobs";
/// A multipart upload's part size; smaller blobs go in one request.
pub const PART_BYTES: usize = 8 << 20;
/// Parts of one multipart upload in flight at once.
const PARTS_IN_FLIGHT: usize = 2;
/// Chunks of a download between the runtime and the thread writing the cache.
const CHUNKS_IN_FLIGHT: usize = 4;
/// Threads of the store's own runtime.
const THREADS: usize = 2;

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(format!("s3: {e}"))
}

fn object_key(hash: &blake3::Hash) -> Key {
    Key::from(format!("{PREFIX}/{}", hash.to_hex()))
}

/// Blobs in a bucket, read through a local cache.
pub struct S3Blobs {
    store: Arc<AmazonS3>,
    runtime: Arc<IoRuntime>,
    cache: DiskBlobs,
    cached: Mutex<CacheIndex>,
    place: String,
}

impl S3Blobs {
    /// Connects to the bucket (creating it when missing), checks it is
    /// this installation's, and opens the local cache, trimming it to its
    /// size.
    pub async fn open(settings: &S3Settings) -> Result<S3Blobs, StoreError> {
        let (store, runtime) = connect(settings).await?;
        if let Some(installation) = settings.installation.clone() {
            let (s, bucket) = (store.clone(), settings.bucket.clone());
            runtime.run(async move { claim_bucket(&s, &bucket, &installation).await }).await?;
        }
        let cache = DiskBlobs::open(&settings.cache_dir)?;
        let mut index = CacheIndex { lru: lru::LruCache::unbounded(), bytes: 0, limit: settings.cache_bytes };
        for hash in cache.list()? {
            if let Some(size) = cache.path(&hash).and_then(|p| std::fs::metadata(p).ok()).map(|m| m.len()) {
                for gone in index.touch(hash, size) {
                    cache.delete(&gone)?;
                }
            }
        }
        Ok(S3Blobs { store, runtime, cache, cached: Mutex::new(index), place: place(settings) })
    }

    /// Whether the bucket answers (created when missing), without touching
    /// the local cache (a server may be using it): what `kiln doctor`
    /// asks. The bucket and where it is.
    pub async fn probe(settings: &S3Settings) -> Result<String, StoreError> {
        connect(settings).await.map(|_| place(settings))
    }

    /// The bucket and where it is (for `kiln doctor` and the start-up log).
    pub fn place(&self) -> &str {
        &self.place
    }

    /// The bytes the local cache holds.
    pub fn cached_bytes(&self) -> u64 {
        self.cached.lock().bytes
    }

    /// Whether the bucket holds `hash`.
    fn exists(&self, hash: &blake3::Hash) -> Result<bool, StoreError> {
        let (store, key) = (self.store.clone(), object_key(hash));
        wait(self.runtime.run(async move {
            match store.head(&key).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(backend(e)),
            }
        }))
    }

    /// Notes a cached blob as just used, removing the least recently used
    /// others past the cache's size.
    fn used(&self, hash: blake3::Hash, size: u64) {
        let gone = self.cached.lock().touch(hash, size);
        for hash in gone {
            if let Err(e) = self.cache.delete(&hash) {
                tracing::warn!(error = %e, "cannot remove a blob from the local cache");
            }
        }
    }

    /// Downloads `hash` into the cache, checking its bytes; the cached file
    /// opened, or `None` when the bucket does not hold it.
    fn download(&self, hash: &blake3::Hash) -> Result<Option<std::fs::File>, StoreError> {
        let (store, key) = (self.store.clone(), object_key(hash));
        let (tx, mut rx) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
        let size = wait(self.runtime.run(async move {
            let got = match store.get(&key).await {
                Ok(got) => got,
                Err(object_store::Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(backend(e)),
            };
            let size = got.meta.size;
            tokio::spawn(async move {
                let mut chunks = got.into_stream();
                while let Some(chunk) = chunks.next().await {
                    let failed = chunk.is_err();
                    if tx.send(chunk.map_err(backend)).await.is_err() || failed {
                        break;
                    }
                }
            });
            Ok(Some(size))
        }))?;
        let Some(size) = size else { return Ok(None) };
        // At most the size the bucket announced is written.
        let mut upload = self.cache.begin(size)?;
        while let Some(chunk) = wait(rx.recv()) {
            upload.write(&chunk?)?;
        }
        let (got, n) = upload.digest();
        if got != *hash || n != size {
            return Err(StoreError::Corrupt(format!("s3 object {}: {n} of {size} bytes, hashing to {got}", object_key(hash))));
        }
        self.cache.commit(upload)?;
        let file = self.cache.open(hash)?.ok_or_else(|| StoreError::Corrupt(format!("cached blob {hash} vanished")))?;
        self.used(*hash, size);
        Ok(Some(file))
    }

    /// Sends a local file of `size` bytes to `hash`'s key: at most
    /// [`PART_BYTES`] in one request, else in parts (never more than
    /// [`PARTS_IN_FLIGHT`] + 1 parts in memory).
    fn send(&self, mut file: std::fs::File, hash: &blake3::Hash, size: u64) -> Result<(), StoreError> {
        if size <= PART_BYTES as u64 {
            let mut bytes = Vec::with_capacity(size as usize);
            file.read_to_end(&mut bytes)?;
            let (store, key) = (self.store.clone(), object_key(hash));
            return wait(self.runtime.run(async move { store.put(&key, PutPayload::from(bytes)).await.map(drop).map_err(backend) }));
        }
        let (store, key) = (self.store.clone(), object_key(hash));
        let mut upload = wait(self.runtime.run(async move { store.put_multipart(&key).await.map_err(backend) }))?;
        match self.send_parts(&mut *upload, file) {
            Ok(()) => wait(self.runtime.run(async move { upload.complete().await.map(drop).map_err(backend) })),
            Err(e) => {
                let _ = wait(self.runtime.run(async move { upload.abort().await.map_err(backend) }));
                Err(e)
            }
        }
    }

    /// The parts of a multipart upload, read from `file`, at most
    /// [`PARTS_IN_FLIGHT`] sent at once.
    fn send_parts(&self, upload: &mut dyn object_store::MultipartUpload, mut file: std::fs::File) -> Result<(), StoreError> {
        let mut in_flight = VecDeque::new();
        loop {
            let mut part = Vec::with_capacity(PART_BYTES);
            (&mut file).take(PART_BYTES as u64).read_to_end(&mut part)?;
            if part.is_empty() {
                break;
            }
            if in_flight.len() == PARTS_IN_FLIGHT {
                wait(finish_part(in_flight.pop_front()))?;
            }
            let sending = upload.put_part(PutPayload::from(part));
            in_flight.push_back(self.runtime.handle()?.spawn(async move { sending.await.map_err(backend) }));
        }
        for part in in_flight {
            wait(finish_part(Some(part)))?;
        }
        Ok(())
    }
}

/// The bucket's client, on a runtime of its own, once the bucket exists.
async fn connect(settings: &S3Settings) -> Result<(Arc<AmazonS3>, Arc<IoRuntime>), StoreError> {
    let runtime = IoRuntime::start("kiln-s3", THREADS)?;
    let retry = RetryConfig { backoff: BackoffConfig::default(), max_retries: 3, retry_timeout: Duration::from_secs(15) };
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(&settings.bucket)
        .with_region(&settings.region)
        .with_retry(retry)
        .with_client_options(ClientOptions::new().with_connect_timeout(Duration::from_secs(5)).with_timeout(Duration::from_secs(60)));
    if let Some(endpoint) = &settings.endpoint {
        builder = builder.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://")).with_virtual_hosted_style_request(false);
    }
    let store = Arc::new(builder.build().map_err(backend)?);
    let (s, wanted) = (store.clone(), settings.clone());
    runtime.run(async move { ensure_bucket(&s, &wanted).await }).await?;
    Ok((store, runtime))
}

/// "bucket `NAME` at ENDPOINT".
fn place(settings: &S3Settings) -> String {
    format!("bucket `{}` at {}", settings.bucket, settings.endpoint.as_deref().unwrap_or("AWS S3"))
}

/// Waits for a spawned part upload.
async fn finish_part(part: Option<tokio::task::JoinHandle<Result<(), StoreError>>>) -> Result<(), StoreError> {
    match part {
        Some(part) => part.await.map_err(backend)?,
        None => Ok(()),
    }
}

impl BlobStore for S3Blobs {
    fn put(&self, data: &[u8]) -> Result<blake3::Hash, StoreError> {
        // Into the cache first, then sent from there (as an upload is):
        // a large output is not copied whole into a request body.
        let hash = self.cache.put(data)?;
        let size = data.len() as u64;
        if !self.exists(&hash)? {
            let file = self.cache.open(&hash)?.ok_or_else(|| StoreError::Corrupt(format!("cached blob {hash} vanished")))?;
            if let Err(e) = self.send(file, &hash, size) {
                // Not in the bucket: not in the cache either, or this host
                // would take it for stored.
                self.cached.lock().forget(&hash);
                let _ = self.cache.delete(&hash);
                return Err(e);
            }
        }
        self.used(hash, size);
        Ok(hash)
    }

    fn begin(&self, limit: u64) -> Result<BlobUpload, StoreError> {
        self.cache.begin(limit)
    }

    fn commit(&self, upload: BlobUpload) -> Result<(blake3::Hash, u64), StoreError> {
        // Always sent, even when the bucket holds these bytes (the object
        // is replaced by the same bytes): an upload of known bytes that
        // finished sooner would tell the uploader someone had stored them.
        let staged = upload.seal()?;
        let (hash, size) = (staged.hash, staged.size);
        let path = staged.path().ok_or_else(|| StoreError::Corrupt("a sealed upload without its file".into()))?;
        self.send(std::fs::File::open(path)?, &hash, size)?;
        self.cache.adopt(staged)?;
        self.used(hash, size);
        Ok((hash, size))
    }

    fn contains(&self, hash: &blake3::Hash) -> Result<bool, StoreError> {
        if self.cache.contains(hash)? {
            return Ok(true);
        }
        self.exists(hash)
    }

    fn stored(&self, hash: &blake3::Hash) -> Result<bool, StoreError> {
        self.exists(hash)
    }

    fn presumed_present(&self, _hash: &blake3::Hash) -> bool {
        true
    }

    fn open(&self, hash: &blake3::Hash) -> Result<Option<std::fs::File>, StoreError> {
        if let Some(file) = self.cache.open(hash)? {
            self.used(*hash, file.metadata()?.len());
            return Ok(Some(file));
        }
        self.download(hash)
    }

    fn delete(&self, hash: &blake3::Hash) -> Result<(), StoreError> {
        let (store, key) = (self.store.clone(), object_key(hash));
        wait(self.runtime.run(async move {
            match store.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(backend(e)),
            }
        }))?;
        self.cached.lock().forget(hash);
        self.cache.delete(hash)
    }

    fn usage(&self) -> Result<super::BlobUsage, StoreError> {
        let store = self.store.clone();
        wait(self.runtime.run(async move {
            let mut objects = store.list(Some(&Key::from(PREFIX)));
            let mut usage = super::BlobUsage::default();
            while let Some(object) = objects.next().await {
                let object = object.map_err(backend)?;
                if object.location.filename().is_some_and(|n| blake3::Hash::from_hex(n).is_ok()) {
                    usage.bytes += object.size;
                    usage.blobs += 1;
                }
            }
            Ok(usage)
        }))
    }

    fn list(&self) -> Result<Vec<blake3::Hash>, StoreError> {
        let store = self.store.clone();
        wait(self.runtime.run(async move {
            let mut objects = store.list(Some(&Key::from(PREFIX)));
            let mut out = Vec::new();
            while let Some(object) = objects.next().await {
                let object = object.map_err(backend)?;
                if let Some(hash) = object.location.filename().and_then(|n| blake3::Hash::from_hex(n).ok()) {
                    out.push(hash);
                }
            }
            Ok(out)
        }))
    }
}

/// The cached blobs, least recently used first, and their bytes.
struct CacheIndex {
    lru: lru::LruCache<blake3::Hash, u64>,
    bytes: u64,
    limit: u64,
}

impl CacheIndex {
    /// Notes `hash` (`size` bytes) as just used; the blobs to remove to get
    /// back under the limit, never `hash` itself.
    fn touch(&mut self, hash: blake3::Hash, size: u64) -> Vec<blake3::Hash> {
        if self.lru.put(hash, size).is_none() {
            self.bytes += size;
        }
        let mut gone = Vec::new();
        while self.bytes > self.limit && self.lru.len() > 1 {
            let Some((old, old_size)) = self.lru.pop_lru() else { break };
            self.bytes -= old_size;
            gone.push(old);
        }
        gone
    }

    fn forget(&mut self, hash: &blake3::Hash) {
        if let Some(size) = self.lru.pop(hash) {
            self.bytes -= size;
        }
    }
}

/// Marks the bucket as `installation`'s unless it is marked; refuses one
/// marked for another installation, whose blob collection would delete
/// this one's blobs (it knows nothing of their records). Two installations
/// marking a new bucket at once: each reads the mark back, and the one
/// whose write was replaced refuses.
async fn claim_bucket(store: &AmazonS3, bucket: &str, installation: &str) -> Result<(), StoreError> {
    let key = Key::from(OWNER_KEY);
    let read = |store: &AmazonS3| {
        let key = key.clone();
        let store = store.clone();
        async move {
            match store.get(&key).await {
                // An id is a UUID: anything larger is not kiln's mark (and is not read).
                Ok(got) if got.meta.size > MAX_OWNER_BYTES => Ok(Some(format!("an object of {} bytes, not a kiln installation id", got.meta.size))),
                Ok(got) => got.bytes().await.map(|b| Some(String::from_utf8_lossy(&b).trim().to_string())).map_err(backend),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(backend(e)),
            }
        }
    };
    if read(store).await?.is_none() {
        store.put(&key, PutPayload::from(installation.to_string())).await.map_err(backend)?;
    }
    match read(store).await? {
        Some(owner) if owner == installation => Ok(()),
        owner => Err(StoreError::Backend(format!(
            "s3: bucket `{bucket}` belongs to another kiln installation ({}): its blob collection would delete this installation's blobs; give each installation a bucket of its own",
            owner.unwrap_or_default()
        ))),
    }
}

/// Creates the bucket unless it exists. A bucket this account may not
/// create is fine when it can be listed (made by the operator, or with
/// credentials that only read and write objects).
async fn ensure_bucket(store: &AmazonS3, settings: &S3Settings) -> Result<(), StoreError> {
    let credential = store.credentials().get_credential().await.map_err(backend)?;
    let base = settings.endpoint.clone().unwrap_or_else(|| format!("https://s3.{}.amazonaws.com", settings.region));
    let url = format!("{}/{}", base.trim_end_matches('/'), settings.bucket);
    // Outside us-east-1, AWS wants the region named in the request.
    let body = match settings.region.as_str() {
        "us-east-1" => String::new(),
        region => format!(
            "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LocationConstraint>{region}</LocationConstraint></CreateBucketConfiguration>"
        ),
    };
    let mut request = http::Request::builder().method(http::Method::PUT).uri(&url).body(HttpRequestBody::from(body.clone())).map_err(backend)?;
    AwsAuthorizer::new(&credential, "s3", &settings.region).authorize(&mut request, None);
    let client = reqwest::Client::builder().timeout(Duration::from_secs(15)).build().map_err(backend)?;
    let mut create = client.put(&url).body(body);
    for (name, value) in request.headers() {
        create = create.header(name, value);
    }
    let refused = match create.send().await {
        // 409: it exists (ours, or someone else's — then listing tells).
        Ok(r) if r.status().is_success() => return Ok(()),
        Ok(r) if r.status() == http::StatusCode::CONFLICT => "it exists".to_string(),
        Ok(r) => format!("HTTP {}", r.status()),
        Err(e) => e.to_string(),
    };
    store
        .list_with_delimiter(Some(&Key::from(PREFIX)))
        .await
        .map(drop)
        .map_err(|e| StoreError::Backend(format!("s3: bucket `{}` could not be created ({refused}) nor listed: {e}", settings.bucket)))
}

#[cfg(test)]
mod tests;
