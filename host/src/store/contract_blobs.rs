//! The contract every [`BlobStore`] keeps, written against the trait only:
//! the file-system store and the S3 store run the same cases
//! ([`run_all`]); what a store does beneath (a local cache, multipart
//! uploads) is its own tests' business.

use std::io::Read;

use super::{BlobStore, StoreError};

fn read_all(blobs: &dyn BlobStore, hash: &blake3::Hash) -> Option<Vec<u8>> {
    let mut file = blobs.open(hash).expect("the store answers")?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).expect("the blob reads");
    Some(bytes)
}

/// Bytes no other case (or run) stores: `n` of them, seeded by `seed`.
pub(crate) fn unique_bytes(seed: &str, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 64);
    let mut block = blake3::hash(format!("{seed}/{}", uuid::Uuid::new_v4()).as_bytes());
    while out.len() < n {
        out.extend_from_slice(block.as_bytes());
        block = blake3::hash(block.as_bytes());
    }
    out.truncate(n);
    out
}

/// Every case, on one store (blobs of other cases may be present).
pub(crate) fn run_all(blobs: &dyn BlobStore) {
    put_open_and_delete(blobs);
    streamed_uploads_of_any_size(blobs);
    an_upload_past_its_limit_is_refused(blobs);
}

fn put_open_and_delete(blobs: &dyn BlobStore) {
    let data = unique_bytes("put", 1000);
    let hash = blake3::hash(&data);
    assert!(!blobs.contains(&hash).unwrap());
    assert!(read_all(blobs, &hash).is_none(), "nothing stored yet");
    let before = blobs.usage().unwrap();
    assert_eq!(blobs.put(&data).unwrap(), hash);
    assert_eq!(blobs.put(&data).unwrap(), hash, "storing known bytes again is fine");
    let with = blobs.usage().unwrap();
    assert_eq!((with.bytes.checked_sub(before.bytes), with.blobs.checked_sub(before.blobs)), (Some(1000), Some(1)), "{before:?} → {with:?}");
    assert!(blobs.contains(&hash).unwrap());
    assert_eq!(read_all(blobs, &hash).as_deref(), Some(&data[..]));
    assert!(blobs.list().unwrap().contains(&hash));
    blobs.delete(&hash).unwrap();
    assert!(!blobs.contains(&hash).unwrap());
    assert!(read_all(blobs, &hash).is_none(), "deleted");
    assert!(!blobs.list().unwrap().contains(&hash));
    assert_eq!(blobs.usage().unwrap(), before, "measured without the deleted blob");
    blobs.delete(&hash).unwrap();
    let empty = blobs.put(b"").unwrap();
    assert_eq!(read_all(blobs, &empty).as_deref(), Some(&b""[..]));
}

fn streamed_uploads_of_any_size(blobs: &dyn BlobStore) {
    // One chunk; and 20 MiB + 5 bytes in uneven chunks (an S3 store sends
    // that in three parts).
    for size in [10, (20 << 20) + 5] {
        let data = unique_bytes("stream", size);
        let mut upload = blobs.begin(size as u64).unwrap();
        for chunk in data.chunks(777_777) {
            upload.write(chunk).unwrap();
        }
        let hash = blake3::hash(&data);
        assert_eq!(blobs.commit(upload).unwrap(), (hash, size as u64));
        assert!(blobs.contains(&hash).unwrap());
        assert!(read_all(blobs, &hash) == Some(data), "{size} bytes read back");
        blobs.delete(&hash).unwrap();
    }
}

fn an_upload_past_its_limit_is_refused(blobs: &dyn BlobStore) {
    let mut upload = blobs.begin(4).unwrap();
    upload.write(b"1234").unwrap();
    assert!(matches!(upload.write(b"5"), Err(StoreError::TooLarge { limit: 4 })));
}

#[test]
fn the_file_system_store_keeps_the_blob_contract() {
    let dir = tempfile::tempdir().unwrap();
    run_all(&super::DiskBlobs::open(dir.path()).unwrap());
}
