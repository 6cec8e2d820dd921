//! The embedded blob store: one file per blob under
//! `<dir>/<first two hex digits>/<hex>`, written to a temp file, fsynced,
//! renamed into place and the directory fsynced, so a crash leaves either
//! the whole blob or nothing.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{BlobStore, StoreError};

/// Blobs in a directory.
pub struct DiskBlobs {
    dir: PathBuf,
    tmp: PathBuf,
}

impl DiskBlobs {
    /// Opens (creating) the store in `dir`; clears leftovers of interrupted writes.
    pub fn open(dir: impl Into<PathBuf>) -> Result<DiskBlobs, StoreError> {
        let dir = dir.into();
        let tmp = dir.join("tmp");
        crate::atomic_file::create_dir_all(&tmp)?;
        for entry in std::fs::read_dir(&tmp)? {
            let _ = std::fs::remove_file(entry?.path());
        }
        Ok(DiskBlobs { dir, tmp })
    }

    fn final_path(&self, hash: &blake3::Hash) -> PathBuf {
        let hex = hash.to_hex();
        self.dir.join(&hex[..2]).join(hex.as_str())
    }

    /// The file holding `hash`, when stored.
    pub fn path(&self, hash: &blake3::Hash) -> Option<PathBuf> {
        let p = self.final_path(hash);
        p.is_file().then_some(p)
    }

    /// Stores a sealed upload (staged anywhere on this file system) under
    /// its hash; its hash and size.
    pub fn adopt(&self, staged: StagedBlob) -> Result<(blake3::Hash, u64), StoreError> {
        let (hash, size) = (staged.hash, staged.size);
        move_into_place(&staged.take(), &self.final_path(&hash))?;
        Ok((hash, size))
    }

    fn temp_file(&self) -> Result<(PathBuf, File), StoreError> {
        let path = self.tmp.join(uuid::Uuid::new_v4().simple().to_string());
        let file = File::options().write(true).create_new(true).open(&path)?;
        Ok((path, file))
    }
}

/// Moves a complete, synced temp file to its content address.
///
/// The work is the same whether or not the address already holds the
/// bytes: the temp file is renamed over it (same content, so nothing a
/// reader sees changes; one holding the old file keeps it) and the shard
/// directory synced. Skipping either for known content made storing bytes
/// some other tenant had already stored measurably faster — an answer to
/// "has anyone stored these bytes?".
fn move_into_place(tmp: &Path, dest: &Path) -> Result<(), StoreError> {
    let parent = dest.parent().ok_or_else(|| StoreError::Corrupt(dest.display().to_string()))?;
    if !parent.is_dir() {
        // The new shard's entry in the root must be durable too.
        crate::atomic_file::create_dir_all(parent)?;
    }
    if let Err(e) = std::fs::rename(tmp, dest) {
        let _ = std::fs::remove_file(tmp);
        return Err(e.into());
    }
    File::open(parent)?.sync_all()?;
    Ok(())
}

impl BlobStore for DiskBlobs {
    fn usage(&self) -> Result<super::BlobUsage, StoreError> {
        let mut usage = super::BlobUsage::default();
        for shard in std::fs::read_dir(&self.dir)? {
            let shard = shard?;
            if shard.file_name() == "tmp" || !shard.file_type()?.is_dir() {
                continue;
            }
            for entry in std::fs::read_dir(shard.path())? {
                // A blob deleted during the walk is not counted.
                match entry.and_then(|e| e.metadata()) {
                    Ok(meta) if meta.is_file() => {
                        usage.bytes += meta.len();
                        usage.blobs += 1;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(usage)
    }

    fn put(&self, data: &[u8]) -> Result<blake3::Hash, StoreError> {
        // A node's output: bytes already stored are not written again (a
        // job saving what an earlier run saved pays no sync). Uploads, whose
        // timing a client sees directly, always do the whole work (`commit`).
        let hash = blake3::hash(data);
        let dest = self.final_path(&hash);
        if dest.exists() {
            return Ok(hash);
        }
        let (tmp, mut file) = self.temp_file()?;
        let written = file.write_all(data).and_then(|()| file.sync_data());
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        move_into_place(&tmp, &dest)?;
        Ok(hash)
    }

    fn begin(&self, limit: u64) -> Result<BlobUpload, StoreError> {
        BlobUpload::create(self.tmp.join(uuid::Uuid::new_v4().simple().to_string()), limit)
    }

    fn commit(&self, upload: BlobUpload) -> Result<(blake3::Hash, u64), StoreError> {
        self.adopt(upload.seal()?)
    }

    fn contains(&self, hash: &blake3::Hash) -> Result<bool, StoreError> {
        Ok(self.final_path(hash).is_file())
    }

    fn open(&self, hash: &blake3::Hash) -> Result<Option<File>, StoreError> {
        match File::open(self.final_path(hash)) {
            Ok(file) => Ok(Some(file)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn delete(&self, hash: &blake3::Hash) -> Result<(), StoreError> {
        match std::fs::remove_file(self.final_path(hash)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    fn list(&self) -> Result<Vec<blake3::Hash>, StoreError> {
        let mut out = Vec::new();
        for shard in std::fs::read_dir(&self.dir)? {
            let shard = shard?;
            if shard.file_name() == "tmp" || !shard.file_type()?.is_dir() {
                continue;
            }
            for entry in std::fs::read_dir(shard.path())? {
                if let Some(hash) = entry?.file_name().to_str().and_then(|n| blake3::Hash::from_hex(n).ok()) {
                    out.push(hash);
                }
            }
        }
        Ok(out)
    }
}

/// A blob being streamed in: staged in a local file (the store's own, from
/// [`BlobStore::begin`]) and hashed as it arrives, then handed to
/// [`BlobStore::commit`]. Dropped before that, it leaves nothing behind.
pub struct BlobUpload {
    path: Option<PathBuf>,
    file: File,
    hasher: blake3::Hasher,
    size: u64,
    limit: u64,
    /// The free space it must leave (see [`BlobUpload::keep_free`]), and
    /// the size when it was last looked at.
    floor: Option<(super::space::DiskFloor, u64)>,
}

impl BlobUpload {
    /// Stages an upload of at most `limit` bytes in a new file at `path`
    /// (for a [`BlobStore`] implementation's `begin`).
    pub fn create(path: PathBuf, limit: u64) -> Result<BlobUpload, StoreError> {
        let file = File::options().write(true).create_new(true).open(&path)?;
        Ok(BlobUpload { path: Some(path), file, hasher: blake3::Hasher::new(), size: 0, limit, floor: None })
    }

    /// Refuses (`StorageFull`) to start, or to go on every
    /// [`CHECK_EVERY`](super::space::CHECK_EVERY) bytes, while less than
    /// `floor`'s reserve is free.
    pub fn keep_free(&mut self, floor: super::space::DiskFloor) -> Result<(), StoreError> {
        floor.reserve(super::space::LargeWrite::Upload, 0)?;
        self.floor = Some((floor, self.size));
        Ok(())
    }

    /// Appends a chunk.
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), StoreError> {
        self.size += chunk.len() as u64;
        if self.size > self.limit {
            return Err(StoreError::TooLarge { limit: self.limit });
        }
        if let Some((floor, checked_at)) = &mut self.floor
            && self.size - *checked_at >= super::space::CHECK_EVERY
        {
            floor.reserve(super::space::LargeWrite::Upload, 0)?;
            *checked_at = self.size;
        }
        self.hasher.update(chunk);
        self.file.write_all(chunk)?;
        Ok(())
    }

    /// The hash and size of what was written so far.
    pub fn digest(&self) -> (blake3::Hash, u64) {
        (self.hasher.finalize(), self.size)
    }

    /// Ends the upload: its staged file, synced, with the hash and size
    /// (for a [`BlobStore`] implementation's `commit`).
    pub fn seal(mut self) -> Result<StagedBlob, StoreError> {
        self.file.sync_data()?;
        Ok(StagedBlob { path: self.path.take(), hash: self.hasher.finalize(), size: self.size })
    }
}

impl Drop for BlobUpload {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A sealed upload's local file: removed when dropped, unless taken.
pub struct StagedBlob {
    path: Option<PathBuf>,
    pub hash: blake3::Hash,
    pub size: u64,
}

impl StagedBlob {
    /// The staged file (to copy elsewhere).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Takes the staged file: the caller moves or removes it.
    pub fn take(mut self) -> PathBuf {
        self.path.take().unwrap_or_default()
    }
}

impl Drop for StagedBlob {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Uploading known bytes does the work new bytes take: the synced temp
    /// file replaces the stored one (a new inode), never skipped. A node's
    /// output of known bytes is not written again.
    #[test]
    fn known_bytes_are_written_and_committed_like_new_ones() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let blobs = DiskBlobs::open(dir.path()).unwrap();
        let h = blobs.put(b"shared bytes").unwrap();
        let inode = |blobs: &DiskBlobs| std::fs::metadata(blobs.path(&h).unwrap()).unwrap().ino();
        let first = inode(&blobs);
        assert_eq!(blobs.put(b"shared bytes").unwrap(), h);
        let second = inode(&blobs);
        assert_eq!(first, second, "an output of known bytes is not written again");
        let mut up = blobs.begin(100).unwrap();
        up.write(b"shared bytes").unwrap();
        assert_eq!(blobs.commit(up).unwrap(), (h, 12));
        assert_ne!(inode(&blobs), second, "a streamed upload of known bytes committed a new file");
        assert_eq!(std::fs::read(blobs.path(&h).unwrap()).unwrap(), b"shared bytes");
        assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0, "no temp file left");
    }

    #[test]
    fn put_stream_dedup_delete() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = DiskBlobs::open(dir.path()).unwrap();
        let h = blobs.put(b"hello").unwrap();
        assert_eq!(h, blake3::hash(b"hello"));
        assert_eq!(std::fs::read(blobs.path(&h).unwrap()).unwrap(), b"hello");
        let mut up = blobs.begin(100).unwrap();
        up.write(b"hel").unwrap();
        up.write(b"lo").unwrap();
        assert_eq!(blobs.commit(up).unwrap(), (h, 5));
        assert_eq!(blobs.list().unwrap(), vec![h]);
        // Aborted and oversize uploads leave no temp files.
        let mut up = blobs.begin(4).unwrap();
        assert!(matches!(up.write(b"12345"), Err(StoreError::TooLarge { limit: 4 })));
        drop(up);
        drop(blobs.begin(10).unwrap());
        assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
        blobs.delete(&h).unwrap();
        assert!(!blobs.contains(&h).unwrap());
        blobs.delete(&h).unwrap();
    }
}
