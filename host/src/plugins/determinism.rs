//! What a node call sees of time and randomness.
//!
//! Every node's result is cached and reused as if the node were a pure
//! function of its inputs, so by default the host makes it one: a node call
//! gets a virtual wall clock (always [`VIRTUAL_WALL_CLOCK`]), a virtual
//! monotonic clock that advances [`MONOTONIC_STEP`] per read (code polling
//! time still sees it move; real time limits are enforced by the epoch
//! ticker, not by the guest's clock), and random generators seeded from the
//! node's cache key, so a re-run computes the very bytes the cache holds.
//! It also closes a side channel: a tenant's node cannot time another
//! tenant's work through a shared clock.
//!
//! A manifest may declare classes `nondeterministic`; their calls get the
//! real clocks and the OS's randomness, and their results are never reused
//! (the executor salts their cache keys with a fresh value per run).
//!
//! The virtual `wasi:random/random` ("secure") bytes are predictable by
//! anyone who knows the node's inputs: a node that needs secrets of its own
//! (nonces, keys) must be declared nondeterministic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use wasmtime_wasi::WasiCtxBuilder;
use wasmtime_wasi::clocks::{HostMonotonicClock, HostWallClock};

use crate::value::Value;

/// The virtual wall clock: 2000-01-01T00:00:00Z, for every call.
pub const VIRTUAL_WALL_CLOCK: Duration = Duration::from_secs(946_684_800);

/// How far the virtual monotonic clock advances at each read (it starts at 0).
pub const MONOTONIC_STEP: Duration = Duration::from_micros(1);

/// A seed for a node call's virtual randomness.
pub type Seed = [u8; 32];

/// The time and randomness one node call gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestWorld {
    /// Virtual clocks; random generators seeded with this.
    Virtual(Seed),
    /// The host's clocks and the OS's randomness (nondeterministic classes).
    Real,
}

impl GuestWorld {
    /// Installs these clocks and generators in `wasi`.
    pub fn apply(self, wasi: &mut WasiCtxBuilder) {
        let GuestWorld::Virtual(seed) = self else { return };
        let stream = |purpose: &str| SeededRng(blake3::Hasher::new_derive_key(purpose).update(&seed).finalize_xof());
        let mut insecure_seed = [0u8; 16];
        stream("kiln node insecure-seed v1").0.fill(&mut insecure_seed);
        wasi.wall_clock(VirtualWallClock)
            .monotonic_clock(VirtualMonotonicClock(AtomicU64::new(0)))
            .secure_random(stream("kiln node random v1"))
            .insecure_random(stream("kiln node insecure-random v1"))
            .insecure_random_seed(u128::from_le_bytes(insecure_seed));
    }
}

/// The seed of a node call whose cache key is `key`.
pub fn seed_from_key(key: &blake3::Hash) -> Seed {
    blake3::derive_key("kiln node seed v1", key.as_bytes())
}

/// The seed of a node call that has no cache key (a call made outside a
/// run, or whose upstream could not be keyed): derived from its class and
/// input values, so it is as repeatable as the call itself.
pub fn seed_from_inputs(class_type: &str, inputs: &[(String, Value)]) -> Seed {
    let mut h = blake3::Hasher::new_derive_key("kiln node seed from inputs v1");
    let mut field = |bytes: &[u8]| {
        h.update(&(bytes.len() as u64).to_le_bytes());
        h.update(bytes);
    };
    field(class_type.as_bytes());
    for (name, value) in inputs {
        field(name.as_bytes());
        match value {
            Value::Int(v) => field(&[&[b'i'][..], &v.to_le_bytes()].concat()),
            Value::Float(v) => field(&[&[b'f'][..], &v.to_bits().to_le_bytes()].concat()),
            Value::Bool(v) => field(&[b'b', u8::from(*v)]),
            Value::String(v) => field(&[&[b's'][..], v.as_bytes()].concat()),
            Value::Tensor(t) => field(&[&[b't'][..], t.content_hash().as_bytes()].concat()),
        }
    }
    *h.finalize().as_bytes()
}

/// The wall clock that always reads [`VIRTUAL_WALL_CLOCK`].
struct VirtualWallClock;

impl HostWallClock for VirtualWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        VIRTUAL_WALL_CLOCK
    }
}

/// A monotonic clock that advances [`MONOTONIC_STEP`] per read, in ns.
struct VirtualMonotonicClock(AtomicU64);

impl HostMonotonicClock for VirtualMonotonicClock {
    fn resolution(&self) -> u64 {
        MONOTONIC_STEP.as_nanos() as u64
    }
    fn now(&self) -> u64 {
        self.0.fetch_add(MONOTONIC_STEP.as_nanos() as u64, Ordering::Relaxed)
    }
}

/// A random stream: the blake3 extendable output of a seed (portable and
/// stable across releases, unlike `rand`'s `StdRng`).
struct SeededRng(blake3::OutputReader);

impl rand_core::TryRng for SeededRng {
    type Error = std::convert::Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        let mut b = [0u8; 4];
        self.0.fill(&mut b);
        Ok(u32::from_le_bytes(b))
    }
    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        let mut b = [0u8; 8];
        self.0.fill(&mut b);
        Ok(u64::from_le_bytes(b))
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        self.0.fill(dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::Rng;

    #[test]
    fn virtual_clocks_and_seeded_streams_repeat() {
        let wall = VirtualWallClock;
        assert_eq!(wall.now(), VIRTUAL_WALL_CLOCK);
        let mono = VirtualMonotonicClock(AtomicU64::new(0));
        let (a, b) = (mono.now(), mono.now());
        assert_eq!(b - a, 1_000, "one step per read");

        let stream = |seed: &[u8]| {
            let mut rng = SeededRng(blake3::Hasher::new().update(seed).finalize_xof());
            let mut bytes = [0u8; 40];
            rng.fill_bytes(&mut bytes);
            (bytes, rng.next_u64())
        };
        assert_eq!(stream(b"a"), stream(b"a"));
        assert_ne!(stream(b"a"), stream(b"b"));

        let inputs = |v: i64| vec![("x".to_string(), Value::Int(v)), ("s".to_string(), Value::String("t".into()))];
        assert_eq!(seed_from_inputs("C", &inputs(1)), seed_from_inputs("C", &inputs(1)));
        assert_ne!(seed_from_inputs("C", &inputs(1)), seed_from_inputs("C", &inputs(2)));
        assert_ne!(seed_from_inputs("C", &inputs(1)), seed_from_inputs("D", &inputs(1)));
        let key = blake3::hash(b"key");
        assert_ne!(seed_from_key(&key), *key.as_bytes(), "the key itself never reaches the guest");
    }
}
