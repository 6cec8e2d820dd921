//! The result cache: node results reused across runs.
//!
//! A node's key is its class, the plugin component it runs in, its constant
//! inputs, the content of the input files it names, and the keys (and output
//! slots) of its upstream nodes — never the node id, so identical nodes share
//! a result. Unchanged output nodes are served from here too, which is why an
//! unchanged re-run writes no new files. Bounded by the bytes of tensors held.

use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;

use crate::files::SavedFile;
use crate::value::Value;

/// A cache key.
pub type CacheKey = blake3::Hash;

/// What a node produced.
#[derive(Debug)]
pub struct CachedResult {
    pub values: Vec<Value>,
    pub saved: Vec<SavedFile>,
}

impl CachedResult {
    fn bytes(&self) -> u64 {
        let values: u64 = self.values.iter().map(|v| if let Value::Tensor(t) = v { t.byte_len() } else { 64 }).sum();
        let files: u64 = self.saved.iter().map(|f| 128 + (f.filename.len() + f.subfolder.len()) as u64).sum();
        values + files + 256
    }
}

/// An LRU of node results bounded by size.
pub struct ResultCache {
    inner: Mutex<Inner>,
}

struct Inner {
    lru: LruCache<CacheKey, Arc<CachedResult>>,
    bytes: u64,
    limit: u64,
}

impl ResultCache {
    /// A cache holding at most `limit_bytes` of results (0 disables caching).
    pub fn new(limit_bytes: u64) -> ResultCache {
        ResultCache { inner: Mutex::new(Inner { lru: LruCache::unbounded(), bytes: 0, limit: limit_bytes }) }
    }

    /// The result for `key`, marking it recently used.
    pub fn get(&self, key: &CacheKey) -> Option<Arc<CachedResult>> {
        self.inner.lock().lru.get(key).cloned()
    }

    /// Stores a result, evicting the least recently used to stay in bounds.
    pub fn put(&self, key: CacheKey, result: Arc<CachedResult>) {
        let mut inner = self.inner.lock();
        let size = result.bytes();
        if size > inner.limit {
            return;
        }
        if let Some(old) = inner.lru.put(key, result) {
            inner.bytes -= old.bytes();
        }
        inner.bytes += size;
        while inner.bytes > inner.limit {
            match inner.lru.pop_lru() {
                Some((_, old)) => inner.bytes -= old.bytes(),
                None => break,
            }
        }
    }

    /// Whether the cache holds this very result under `key` (without
    /// marking it used).
    pub fn holds(&self, key: &CacheKey, result: &Arc<CachedResult>) -> bool {
        self.inner.lock().lru.peek(key).is_some_and(|held| Arc::ptr_eq(held, result))
    }

    /// Drops the result for `key` (its files are gone).
    pub fn remove(&self, key: &CacheKey) {
        let mut inner = self.inner.lock();
        if let Some(old) = inner.lru.pop(key) {
            inner.bytes -= old.bytes();
        }
    }

    /// Drops everything.
    pub fn clear(&self) {
        let mut inner = self.inner.lock();
        inner.lru.clear();
        inner.bytes = 0;
    }

    /// Number of results held.
    pub fn len(&self) -> usize {
        self.inner.lock().lru.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Builds a node's cache key.
pub struct KeyBuilder(blake3::Hasher);

impl KeyBuilder {
    /// Starts a key for `class_type` in the plugin whose component hashes to `plugin`.
    pub fn new(class_type: &str, plugin: &blake3::Hash) -> KeyBuilder {
        let mut h = blake3::Hasher::new();
        h.update(b"kiln-node-v1\0");
        h.update(plugin.as_bytes());
        field(&mut h, class_type.as_bytes());
        KeyBuilder(h)
    }
    /// Adds a constant input.
    pub fn constant(&mut self, name: &str, value: &Value) {
        field(&mut self.0, name.as_bytes());
        match value {
            Value::Int(v) => {
                self.0.update(b"i");
                self.0.update(&v.to_le_bytes());
            }
            Value::Float(v) => {
                self.0.update(b"f");
                self.0.update(&v.to_bits().to_le_bytes());
            }
            Value::Bool(v) => {
                self.0.update(b"b");
                self.0.update(&[*v as u8]);
            }
            Value::String(v) => {
                self.0.update(b"s");
                field(&mut self.0, v.as_bytes());
            }
            Value::Tensor(t) => {
                self.0.update(b"t");
                self.0.update(t.content_hash().as_bytes());
            }
        }
    }
    /// Adds the content of an input file the node reads.
    pub fn file(&mut self, name: &str, content: Option<blake3::Hash>) {
        field(&mut self.0, name.as_bytes());
        self.0.update(b"F");
        self.0.update(content.as_ref().map_or(&[0u8; 32], |h| h.as_bytes()));
    }
    /// Adds a link from output `output` of the node keyed `upstream`.
    pub fn link(&mut self, name: &str, upstream: &CacheKey, output: u32) {
        field(&mut self.0, name.as_bytes());
        self.0.update(b"L");
        self.0.update(upstream.as_bytes());
        self.0.update(&output.to_le_bytes());
    }
    /// Adds a value that makes the key unique (e.g. the node id for nodes
    /// that ask for it).
    pub fn salt(&mut self, name: &str, value: &str) {
        field(&mut self.0, name.as_bytes());
        self.0.update(b"S");
        field(&mut self.0, value.as_bytes());
    }
    /// The key.
    pub fn finish(self) -> CacheKey {
        self.0.finalize()
    }
}

fn field(h: &mut blake3::Hasher, bytes: &[u8]) {
    h.update(&(bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;

    fn key(f: impl FnOnce(&mut KeyBuilder)) -> CacheKey {
        let mut k = KeyBuilder::new("C", &blake3::hash(b"p"));
        f(&mut k);
        k.finish()
    }

    #[test]
    fn keys_separate_fields_and_types() {
        assert_ne!(key(|k| k.constant("a", &Value::Int(1))), key(|k| k.constant("a", &Value::Float(1.0))));
        assert_ne!(key(|k| k.constant("ab", &Value::String("c".into()))), key(|k| k.constant("a", &Value::String("bc".into()))));
        assert_eq!(key(|k| k.constant("a", &Value::Int(1))), key(|k| k.constant("a", &Value::Int(1))));
        let up = blake3::hash(b"u");
        assert_ne!(key(|k| k.link("x", &up, 0)), key(|k| k.link("x", &up, 1)));
    }

    #[test]
    fn evicts_least_recently_used_beyond_the_byte_limit() {
        let cache = ResultCache::new(3 * 4096 + 3 * 256);
        let result = || Arc::new(CachedResult { values: vec![Value::Tensor(Tensor::new(vec![1024], vec![0.0; 1024]).unwrap())], saved: vec![] });
        let keys: Vec<_> = (0..4u8).map(|i| blake3::hash(&[i])).collect();
        for k in &keys[..3] {
            cache.put(*k, result());
        }
        assert!(cache.get(&keys[0]).is_some()); // 0 is now most recent
        cache.put(keys[3], result());
        assert_eq!(cache.len(), 3);
        assert!(cache.get(&keys[1]).is_none(), "least recently used is evicted");
        assert!(cache.get(&keys[0]).is_some());
    }
}
