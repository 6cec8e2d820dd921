//! Records of any size kept out of sled's blob files.
//!
//! sled 0.34 writes a page (a tree node with all its entries) whose
//! serialized size passes a quarter of a segment (128 KiB) to a file of its
//! own under `blobs/`, never syncs that file, and then makes the log's
//! pointer to it durable (its 200 ms fsync, or any flush): a power cut or a
//! kernel crash in between leaves a pointer to nothing, and sled panics
//! opening the store. A leaf splits past 16 entries, so kiln keeps every
//! value it stores in sled at most [`PIECE`] bytes, and such a page never
//! gets near the limit.
//!
//! [`Chunked`] is a tree whose longer values are stored in pieces of that
//! size in the shared `chunks` tree (key: the tree's code ‖ key length ‖ key
//! ‖ write id ‖ piece number, big-endian), while the tree itself holds a
//! stub: `0 ‖ write id ‖ length ‖ piece count`. No JSON starts with a zero
//! byte, so values written before the split existed read as they are.
//!
//! Every write of a split value uses a fresh write id: its pieces go first,
//! then the stub (a crash in between leaves pieces no stub names, which
//! nothing reads), then the pieces of the stub it replaced are removed —
//! so two writers of one key never mix their pieces, and a reader that
//! finds a stub's pieces gone (replaced meanwhile) reads again. Pieces no
//! stub names (a crash mid-write, a removal that failed) are collected by
//! [`PieceSweep`], a bounded stretch of the `chunks` tree per pass.

use sled::{IVec, Tree};

use super::backend;
use crate::store::StoreError;

/// The most bytes of a value stored in one sled entry.
pub(super) const PIECE: usize = 4 << 10;
const STUB_TAG: u8 = 0;
const STUB_LEN: usize = 1 + 8 + 8 + 4;
/// Reads of a value being replaced that give up (a writer per read would
/// have to replace it this often).
const READ_TRIES: usize = 64;

/// A tree whose values may be longer than [`PIECE`].
pub(super) struct Chunked {
    tree: Tree,
    chunks: Tree,
    /// This tree's code in the `chunks` tree's keys.
    code: u8,
}

/// Where a split value's pieces are.
#[derive(Clone, Copy, PartialEq, Debug)]
struct Stub {
    write: u64,
    len: u64,
    pieces: u32,
}

impl Stub {
    /// The stub `stored` is; `None` for a value stored whole (or bytes
    /// that cannot be a stub: read as a value, they fail to decode).
    fn parse(stored: &[u8]) -> Option<Stub> {
        if stored.len() != STUB_LEN || stored[0] != STUB_TAG {
            return None;
        }
        let u64_at = |at: usize| u64::from_be_bytes(stored[at..at + 8].try_into().unwrap_or_default());
        let stub = Stub { write: u64_at(1), len: u64_at(9), pieces: u32::from_be_bytes(stored[17..21].try_into().unwrap_or_default()) };
        (stub.len > 0 && stub.len.div_ceil(PIECE as u64) == u64::from(stub.pieces)).then_some(stub)
    }

    fn bytes(&self) -> [u8; STUB_LEN] {
        let mut out = [0u8; STUB_LEN];
        out[1..9].copy_from_slice(&self.write.to_be_bytes());
        out[9..17].copy_from_slice(&self.len.to_be_bytes());
        out[17..21].copy_from_slice(&self.pieces.to_be_bytes());
        out
    }
}

impl Chunked {
    /// The tree `name` of `db`, its long values' pieces under `code` in the
    /// `chunks` tree (one code per tree, never reused).
    pub(super) fn open(db: &sled::Db, name: &str, code: u8) -> Result<Chunked, StoreError> {
        Ok(Chunked { tree: db.open_tree(name).map_err(backend)?, chunks: db.open_tree("chunks").map_err(backend)?, code })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.tree.is_empty()
    }

    /// The value stored under `key`.
    pub(super) fn get(&self, key: &[u8]) -> Result<Option<IVec>, StoreError> {
        Ok(self.get_stored(key)?.map(|(_, value)| value))
    }

    /// The entry under `key` as stored (what [`Chunked::compare_and_swap`]
    /// compares) and its value.
    pub(super) fn get_stored(&self, key: &[u8]) -> Result<Option<(IVec, IVec)>, StoreError> {
        let mut last: Option<IVec> = None;
        for _ in 0..READ_TRIES {
            let Some(stored) = self.tree.get(key).map_err(backend)? else { return Ok(None) };
            if let Some(value) = self.resolve(key, &stored)? {
                return Ok(Some((stored, value)));
            }
            // The same stub twice without its pieces: not a replacement.
            if last.as_ref() == Some(&stored) {
                return Err(StoreError::Corrupt(format!("{} (pieces missing)", String::from_utf8_lossy(key))));
            }
            last = Some(stored);
        }
        Err(StoreError::Backend(format!("{} is replaced faster than it can be read", String::from_utf8_lossy(key))))
    }

    /// `stored`'s value; `None` when its pieces were removed (the entry was
    /// replaced since it was read).
    fn resolve(&self, key: &[u8], stored: &IVec) -> Result<Option<IVec>, StoreError> {
        let Some(stub) = Stub::parse(stored) else { return Ok(Some(stored.clone())) };
        // The length is only trusted as far as the pieces bear it out.
        let mut value = Vec::with_capacity(usize::try_from(stub.len).unwrap_or(0).min(1 << 20));
        let mut pieces = 0u32;
        for piece in self.chunks.scan_prefix(self.prefix(key, stub.write)) {
            let (_, bytes) = piece.map_err(backend)?;
            if value.len() as u64 + bytes.len() as u64 > stub.len {
                return Ok(None);
            }
            value.extend_from_slice(&bytes);
            pieces += 1;
        }
        if pieces != stub.pieces || value.len() as u64 != stub.len {
            return Ok(None);
        }
        Ok(Some(value.into()))
    }

    /// Stores `value` under `key`.
    pub(super) fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        let old = self.swap_in(key, value)?;
        self.remove_pieces(key, old.as_deref().and_then(Stub::parse));
        Ok(())
    }

    /// Stores `value` under `key`; the value it replaced (`None` also when
    /// that cannot be read: the write is done either way).
    pub(super) fn insert(&self, key: &[u8], value: &[u8]) -> Result<Option<IVec>, StoreError> {
        let Some(old) = self.swap_in(key, value)? else { return Ok(None) };
        // Its pieces are there until this writer, which replaced it, removes them.
        let value = self.resolve(key, &old).unwrap_or_else(|e| {
            tracing::warn!(error = %e, key = %String::from_utf8_lossy(key), "the replaced record could not be read");
            None
        });
        self.remove_pieces(key, Stub::parse(&old));
        Ok(value)
    }

    /// Writes `value`'s pieces and puts its entry in the tree; the entry it
    /// replaced, as stored.
    fn swap_in(&self, key: &[u8], value: &[u8]) -> Result<Option<IVec>, StoreError> {
        let (stored, stub) = self.write_pieces(key, value)?;
        self.tree.insert(key, stored.as_slice()).map_err(|e| {
            self.remove_pieces(key, stub);
            backend(e)
        })
    }

    /// Splits every value stored whole that is longer than a piece (written
    /// before values were split); how many. For a store being opened: no
    /// other writer runs.
    pub(super) fn split_long_values(&self) -> Result<usize, StoreError> {
        let mut split = 0;
        for entry in self.tree.iter() {
            let (key, stored) = entry.map_err(backend)?;
            if stored.len() > PIECE && Stub::parse(&stored).is_none() {
                self.put(&key, &stored)?;
                split += 1;
            }
        }
        Ok(split)
    }

    /// Replaces the entry stored as `current` (`None`: no entry) with
    /// `new` (`None`: removes it); `false` when the entry was not
    /// `current` any more.
    pub(super) fn compare_and_swap(&self, key: &[u8], current: Option<IVec>, new: Option<&[u8]>) -> Result<bool, StoreError> {
        let (stored, stub) = match new {
            Some(value) => {
                let (stored, stub) = self.write_pieces(key, value)?;
                (Some(stored), stub)
            }
            None => (None, None),
        };
        let old_stub = current.as_deref().and_then(Stub::parse);
        match self.tree.compare_and_swap(key, current, stored.as_deref()).map_err(backend) {
            Ok(Ok(())) => {
                self.remove_pieces(key, old_stub);
                Ok(true)
            }
            outcome => {
                self.remove_pieces(key, stub);
                outcome.map(|_| false)
            }
        }
    }

    /// Removes the entry under `key`.
    pub(super) fn remove(&self, key: &[u8]) -> Result<(), StoreError> {
        let old = self.tree.remove(key).map_err(backend)?;
        self.remove_pieces(key, old.as_deref().and_then(Stub::parse));
        Ok(())
    }

    /// Every entry in key order, from `from` on (excluded), values resolved.
    pub(super) fn range_after<'a>(&'a self, from: std::ops::Bound<&[u8]>) -> impl Iterator<Item = Result<(IVec, IVec), StoreError>> + 'a {
        let from = from.map(<[u8]>::to_vec);
        self.tree.range::<Vec<u8>, _>((from, std::ops::Bound::Unbounded)).filter_map(move |entry| {
            let (key, stored) = match entry {
                Ok(entry) => entry,
                Err(e) => return Some(Err(backend(e))),
            };
            let resolved = match self.resolve(&key, &stored) {
                Ok(Some(value)) => return Some(Ok((key, value))),
                // Replaced since the scan read it: its current value.
                Ok(None) => self.get(&key),
                Err(e) => Err(e),
            };
            match resolved {
                Ok(value) => value.map(|v| Ok((key, v))),
                // One record that cannot be read does not stop a scan (the
                // store's opening, an export): it is left out, and said so.
                Err(StoreError::Corrupt(what)) => {
                    tracing::warn!(record = %what, "a stored record cannot be read: left out");
                    None
                }
                Err(e) => Some(Err(e)),
            }
        })
    }

    /// Every entry in key order, values resolved.
    pub(super) fn iter(&self) -> impl Iterator<Item = Result<(IVec, IVec), StoreError>> + '_ {
        self.range_after(std::ops::Bound::Unbounded)
    }

    /// What the tree holds for `value`: itself when short, else a stub
    /// whose pieces are written here.
    fn write_pieces(&self, key: &[u8], value: &[u8]) -> Result<(Vec<u8>, Option<Stub>), StoreError> {
        if value.len() <= PIECE && value.first() != Some(&STUB_TAG) {
            return Ok((value.to_vec(), None));
        }
        let pieces = u32::try_from(value.len().div_ceil(PIECE)).map_err(|_| StoreError::Backend("value too large".into()))?;
        let stub = Stub { write: fresh_write_id(), len: value.len() as u64, pieces };
        let prefix = self.prefix(key, stub.write);
        for (n, piece) in value.chunks(PIECE).enumerate() {
            let mut piece_key = prefix.clone();
            piece_key.extend_from_slice(&(n as u32).to_be_bytes());
            if let Err(e) = self.chunks.insert(piece_key, piece) {
                self.remove_pieces(key, Some(stub));
                return Err(backend(e));
            }
        }
        Ok((stub.bytes().to_vec(), Some(stub)))
    }

    /// Removes a replaced stub's pieces; a failure leaves them unread.
    fn remove_pieces(&self, key: &[u8], stub: Option<Stub>) {
        let Some(stub) = stub else { return };
        let prefix = self.prefix(key, stub.write);
        for n in 0..stub.pieces {
            let mut piece_key = prefix.clone();
            piece_key.extend_from_slice(&n.to_be_bytes());
            if self.chunks.remove(piece_key).is_err() {
                return;
            }
        }
    }

    fn prefix(&self, key: &[u8], write: u64) -> Vec<u8> {
        let mut prefix = Vec::with_capacity(1 + 4 + key.len() + 8);
        prefix.push(self.code);
        prefix.extend_from_slice(&(key.len() as u32).to_be_bytes());
        prefix.extend_from_slice(key);
        prefix.extend_from_slice(&write.to_be_bytes());
        prefix
    }
}

/// Collects pieces no stub names, a stretch of the `chunks` tree per pass
/// ([`PieceSweep::pass`]). A write's pieces exist before its stub does, so
/// pieces are removed only when two passes in a row found them unnamed
/// (passes are the retention sweep's, a minute or more apart; a write
/// takes microseconds between its pieces and its stub).
#[derive(Default)]
pub(super) struct PieceSweep {
    /// Where the next pass starts (empty: the beginning).
    cursor: parking_lot::Mutex<Vec<u8>>,
    /// Piece prefixes found unnamed by the last pass.
    suspects: parking_lot::Mutex<std::collections::HashSet<Vec<u8>>>,
}

impl PieceSweep {
    /// Looks at up to `limit` pieces after the last pass's; removes those
    /// of `trees` (by code) that no stub named then or now; how many.
    pub(super) fn pass(&self, trees: &[&Chunked], limit: usize) -> Result<usize, StoreError> {
        let Some(chunks) = trees.first().map(|t| &t.chunks) else { return Ok(0) };
        let mut cursor = self.cursor.lock();
        let from = std::ops::Bound::Excluded(cursor.clone());
        let start = if cursor.is_empty() { std::ops::Bound::Unbounded } else { from };
        let (mut seen, mut removed, mut last) = (0, 0, None);
        let previous = std::mem::take(&mut *self.suspects.lock());
        let mut suspects = std::collections::HashSet::new();
        for piece in chunks.range::<Vec<u8>, _>((start, std::ops::Bound::Unbounded)).take(limit) {
            let (piece_key, _) = piece.map_err(backend)?;
            seen += 1;
            last = Some(piece_key.to_vec());
            // code ‖ key length ‖ key ‖ write id ‖ piece number
            let Some((code, key, write)) = split_piece_key(&piece_key) else { continue };
            let Some(tree) = trees.iter().find(|t| t.code == code) else { continue };
            let named = tree.tree.get(key).map_err(backend)?.as_deref().and_then(Stub::parse).is_some_and(|s| s.write == write);
            if named {
                continue;
            }
            let prefix = piece_key[..piece_key.len() - 4].to_vec();
            if previous.contains(&prefix) {
                chunks.remove(&piece_key).map_err(backend)?;
                removed += 1;
            } else {
                suspects.insert(prefix);
            }
        }
        *cursor = if seen < limit { Vec::new() } else { last.unwrap_or_default() };
        *self.suspects.lock() = suspects;
        Ok(removed)
    }
}

/// A piece's key read back: its tree's code, the record's key, the write id.
fn split_piece_key(piece_key: &[u8]) -> Option<(u8, &[u8], u64)> {
    let (&code, rest) = piece_key.split_first()?;
    let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    let key = rest.get(4..4 + len)?;
    let write = u64::from_be_bytes(rest.get(4 + len..12 + len)?.try_into().ok()?);
    (rest.len() == 16 + len).then_some((code, key, write))
}

/// A write id no other write of the same key is likely to have picked.
fn fresh_write_id() -> u64 {
    u64::from_le_bytes(uuid::Uuid::new_v4().as_bytes()[..8].try_into().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(tree: &Chunked) -> Vec<(Vec<u8>, Vec<u8>)> {
        tree.iter().map(|e| e.map(|(k, v)| (k.to_vec(), v.to_vec()))).collect::<Result<_, _>>().unwrap()
    }

    #[test]
    fn long_values_round_trip_in_pieces_and_leave_none_behind() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = Chunked::open(&db, "t", 1).unwrap();
        let other = Chunked::open(&db, "u", 2).unwrap();
        let long: Vec<u8> = (0..PIECE * 3 + 17).map(|i| (i % 251) as u8 + 1).collect();
        tree.insert(b"a", b"{\"short\":1}").unwrap();
        tree.insert(b"b", &long).unwrap();
        other.insert(b"b", &long[..PIECE + 1]).unwrap();
        assert_eq!(tree.get(b"a").unwrap().unwrap(), b"{\"short\":1}"[..]);
        assert_eq!(tree.get(b"b").unwrap().unwrap(), long[..]);
        assert_eq!(other.get(b"b").unwrap().unwrap(), long[..PIECE + 1], "trees keep their pieces apart");
        assert_eq!(values(&tree), vec![(b"a".to_vec(), b"{\"short\":1}".to_vec()), (b"b".to_vec(), long.clone())]);
        assert!(db.open_tree("t").unwrap().get(b"b").unwrap().unwrap().len() <= PIECE, "the tree itself holds a stub");
        // Replaced by a shorter value, then removed: no piece is left.
        tree.insert(b"b", &long[..PIECE * 2]).unwrap();
        assert_eq!(tree.get(b"b").unwrap().unwrap(), long[..PIECE * 2]);
        tree.insert(b"b", b"{}").unwrap();
        assert_eq!(db.open_tree("chunks").unwrap().len(), 2, "only the other tree's pieces");
        other.remove(b"b").unwrap();
        assert!(db.open_tree("chunks").unwrap().is_empty());
        // A short value that starts with the stub's tag is split too, so it
        // reads back as itself.
        tree.insert(b"z", &[0, 1, 2]).unwrap();
        assert_eq!(tree.get(b"z").unwrap().unwrap(), [0u8, 1, 2][..]);
    }

    #[test]
    fn a_swap_compares_what_is_stored() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = Chunked::open(&db, "t", 1).unwrap();
        let long = vec![b'x'; PIECE * 2];
        assert!(tree.compare_and_swap(b"k", None, Some(&long)).unwrap());
        let (stored, value) = tree.get_stored(b"k").unwrap().unwrap();
        assert_eq!(value, long[..]);
        assert!(!tree.compare_and_swap(b"k", None, Some(b"lost")).unwrap(), "not absent any more");
        assert!(tree.compare_and_swap(b"k", Some(stored.clone()), Some(b"won")).unwrap());
        assert!(!tree.compare_and_swap(b"k", Some(stored), Some(&long)).unwrap(), "stale");
        assert_eq!(tree.get(b"k").unwrap().unwrap(), b"won"[..]);
        assert!(db.open_tree("chunks").unwrap().is_empty(), "the losers' and the replaced pieces are gone");
    }

    /// A stub whose pieces are gone (or whose fields do not agree) is a
    /// corrupt record, not a retry loop or a huge allocation, and a scan
    /// leaves it out.
    #[test]
    fn a_stub_without_its_pieces_is_corrupt_and_left_out_of_scans() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = Chunked::open(&db, "t", 1).unwrap();
        tree.put(b"a", &vec![b'a'; PIECE * 2]).unwrap();
        tree.put(b"b", &vec![b'b'; PIECE * 2]).unwrap();
        let chunks = db.open_tree("chunks").unwrap();
        let first = chunks.iter().next().unwrap().unwrap().0;
        chunks.remove(first).unwrap();
        assert!(matches!(tree.get(b"a"), Err(StoreError::Corrupt(_))));
        let keys: Vec<_> = tree.iter().map(|e| e.unwrap().0.to_vec()).collect();
        assert_eq!(keys, [b"b".to_vec()]);
        // A stub claiming more bytes than its pieces hold, or a count that
        // does not fit its length, is not taken for a stub.
        let raw = db.open_tree("t").unwrap();
        let mut lying = raw.get(b"b").unwrap().unwrap().to_vec();
        lying[9..17].copy_from_slice(&(u64::MAX / 2).to_be_bytes());
        assert!(Stub::parse(&lying).is_none());
    }

    /// Pieces no stub names go after two passes; a value's live pieces and
    /// a write whose stub came between the passes stay.
    #[test]
    fn pieces_no_stub_names_are_collected_after_two_passes() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = Chunked::open(&db, "t", 1).unwrap();
        let long = vec![b'x'; PIECE * 3];
        tree.put(b"live", &long).unwrap();
        // A crash between a write's pieces and its stub.
        let (_, orphan) = tree.write_pieces(b"cut", &long).unwrap();
        // A write whose pieces are there and whose stub comes later.
        let (late_stub, _) = tree.write_pieces(b"late", &long).unwrap();
        let sweep = PieceSweep::default();
        assert_eq!(sweep.pass(&[&tree], 100).unwrap(), 0, "first pass: suspects only");
        db.open_tree("t").unwrap().insert(b"late", late_stub).unwrap();
        assert_eq!(sweep.pass(&[&tree], 100).unwrap(), 3, "the cut write's three pieces");
        assert!(orphan.is_some());
        assert_eq!(tree.get(b"live").unwrap().unwrap(), long[..]);
        assert_eq!(tree.get(b"late").unwrap().unwrap(), long[..]);
        assert_eq!(db.open_tree("chunks").unwrap().len(), 6);
        // A pass covers a bounded stretch and goes on where the last stopped.
        let small = PieceSweep::default();
        assert_eq!(small.pass(&[&tree], 4).unwrap(), 0);
        assert!(!small.cursor.lock().is_empty());
        small.pass(&[&tree], 4).unwrap();
        assert!(small.cursor.lock().is_empty(), "the end reached: the next pass starts over");
    }

    #[test]
    fn values_stored_whole_before_are_split_once() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let raw = db.open_tree("t").unwrap();
        let long = vec![b'{'; PIECE * 3];
        raw.insert(b"old", long.as_slice()).unwrap();
        raw.insert(b"short", b"{}".as_slice()).unwrap();
        let tree = Chunked::open(&db, "t", 1).unwrap();
        assert_eq!(tree.get(b"old").unwrap().unwrap(), long[..], "read whole as before");
        assert_eq!(tree.split_long_values().unwrap(), 1);
        assert_eq!(raw.get(b"old").unwrap().unwrap().len(), STUB_LEN, "now a stub");
        assert_eq!(tree.get(b"old").unwrap().unwrap(), long[..]);
        assert_eq!(tree.split_long_values().unwrap(), 0, "nothing left to split");
    }

    /// Writers of one key never mix their pieces: every read sees one
    /// writer's whole value.
    #[test]
    fn concurrent_writers_of_one_key_never_mix_pieces() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = std::sync::Arc::new(Chunked::open(&db, "t", 1).unwrap());
        let writers: Vec<_> = (0..4u8)
            .map(|w| {
                let tree = tree.clone();
                std::thread::spawn(move || {
                    for i in 0..200usize {
                        tree.insert(b"k", &vec![w + 1; PIECE * (1 + i % 3) + w as usize]).unwrap();
                    }
                })
            })
            .collect();
        for _ in 0..500 {
            if let Some(v) = tree.get(b"k").unwrap() {
                assert!(v.iter().all(|b| *b == v[0]), "one writer's bytes");
                assert_eq!(v.len() % PIECE, (v[0] - 1) as usize, "and all of them");
            }
        }
        for w in writers {
            w.join().unwrap();
        }
        let last = tree.get(b"k").unwrap().unwrap();
        let pieces = db.open_tree("chunks").unwrap().len();
        assert_eq!(pieces, last.len().div_ceil(PIECE), "only the last value's pieces remain");
    }
}
