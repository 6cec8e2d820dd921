//! The numbers the service hands out: submission numbers
//! (`JobRecord::seq`: a `/api/v2` job's ComfyUI `number`, the order jobs
//! are recovered and taken in) and each owner's ComfyUI priority counter
//! (taken by every `POST /prompt` without a `number`; one per owner, since
//! a server-wide counter would tell an account how many prompts the others
//! sent).
//!
//! On one host both count in memory (submission numbers from above the
//! store's bound, see `retention::recover`; priority counters from 0 at
//! each start, as ComfyUI's). Where hosts share the store, both come from
//! it ([`SharedNumbers`]), so no two hosts hand out the same number and a
//! later one is larger: submission numbers in blocks ([`Block`]), a
//! priority number per request.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use parking_lot::Mutex;

use crate::store::StoreError;
use crate::store::cluster::SharedNumbers;

/// How long a drawn block's numbers may be handed out: a submission on
/// one host more than this after one on another gets a larger number.
const FRESH: Duration = Duration::from_secs(1);
/// The most submission numbers drawn at once.
const MAX_BLOCK: u32 = 64;
/// How long a draw may take before it counts as failed (the store
/// unreachable): the submissions waiting for it fail with it.
const DRAW_TIMEOUT: Duration = Duration::from_secs(5);

/// The service's numbers.
pub(super) struct Numbers {
    /// The next submission number, on one host.
    next_seq: AtomicU64,
    /// Each owner's next priority number, on one host (one entry per owner
    /// that sent a prompt: bounded by the accounts).
    prompts: Mutex<HashMap<String, i64>>,
    /// Where hosts share the store: what they draw from.
    shared: Option<Shared>,
}

struct Shared {
    store: Arc<dyn SharedNumbers>,
    /// Held while a block is drawn: submissions arriving meanwhile wait
    /// for it rather than each drawing their own.
    block: tokio::sync::Mutex<Block>,
}

/// Submission numbers drawn from the shared store and not handed out yet.
/// A block is as large as the submissions of its last [`FRESH`] span
/// asked for: doubled (to [`MAX_BLOCK`]) when one was used up while
/// fresh, halved when one went stale with numbers left (those are never
/// handed out: a gap, not a number out of order).
struct Block {
    /// How long numbers stay fresh ([`FRESH`]).
    fresh: Duration,
    /// How long a draw may take ([`DRAW_TIMEOUT`]).
    timeout: Duration,
    left: VecDeque<u64>,
    drawn_at: Option<Instant>,
    size: u32,
    /// When the last draw failed, and how: submissions that were waiting
    /// for it fail so rather than each waiting for the store again.
    failed: Option<(Instant, StoreError)>,
}

impl Numbers {
    /// Numbers in memory, or from `shared` where hosts share the store.
    pub fn new(shared: Option<Arc<dyn SharedNumbers>>) -> Numbers {
        Numbers::timed(shared, FRESH, DRAW_TIMEOUT)
    }

    fn timed(shared: Option<Arc<dyn SharedNumbers>>, fresh: Duration, timeout: Duration) -> Numbers {
        Numbers {
            next_seq: AtomicU64::new(1),
            prompts: Mutex::default(),
            shared: shared.map(|store| Shared {
                store,
                block: tokio::sync::Mutex::new(Block { fresh, timeout, left: VecDeque::new(), drawn_at: None, size: 1, failed: None }),
            }),
        }
    }

    /// Numbers submissions on one host from after `max` on (at start,
    /// after the store's bound); shared numbers need no start.
    pub fn start_seq_after(&self, max: u64) {
        self.next_seq.store(max.saturating_add(1), Ordering::SeqCst);
    }

    /// A new submission's number.
    pub async fn next_seq(&self) -> Result<u64, StoreError> {
        let Some(shared) = &self.shared else { return Ok(self.next_seq.fetch_add(1, Ordering::SeqCst)) };
        let asked = Instant::now();
        let mut block = shared.block.lock().await;
        block.take(asked, shared.store.as_ref()).await
    }

    /// Takes the next number of `owner`'s priority counter.
    pub async fn next_prompt_number(&self, owner: &str) -> Result<i64, StoreError> {
        if let Some(shared) = &self.shared {
            return shared.store.next_prompt_number(owner).await;
        }
        let mut prompts = self.prompts.lock();
        let counter = prompts.entry(owner.to_string()).or_insert(0);
        let n = *counter;
        *counter += 1;
        Ok(n)
    }
}

impl Block {
    /// The next number, drawing a block when none is left fresh.
    async fn take(&mut self, asked: Instant, store: &dyn SharedNumbers) -> Result<u64, StoreError> {
        let now = Instant::now();
        if let Some(drawn_at) = self.drawn_at
            && now.duration_since(drawn_at) > self.fresh
            && !self.left.is_empty()
        {
            self.left.clear();
            self.size = (self.size / 2).max(1);
        }
        if let Some(n) = self.left.pop_front() {
            return Ok(n);
        }
        if let Some((at, e)) = &self.failed
            && *at > asked
        {
            return Err(again(e));
        }
        let size = if self.drawn_at.is_some_and(|at| now.duration_since(at) <= self.fresh) { (self.size * 2).min(MAX_BLOCK) } else { self.size };
        // Fresh from the moment the store was asked: the numbers are no
        // newer than that.
        let drawing = Instant::now();
        let drawn = tokio::time::timeout(self.timeout, store.draw_seqs(size))
            .await
            .unwrap_or_else(|_| Err(StoreError::Unavailable(format!("no submission numbers within {:?}", self.timeout))));
        match drawn {
            Ok(drawn) => {
                (self.left, self.drawn_at, self.size, self.failed) = (drawn.into(), Some(drawing), size, None);
                self.left.pop_front().ok_or_else(|| StoreError::Backend("the store drew no submission number".into()))
            }
            Err(e) => {
                self.failed = Some((Instant::now(), again(&e)));
                Err(e)
            }
        }
    }
}

/// The same failure once more, for another submission that waited on it
/// (`StoreError` is not `Clone`): unavailable stays unavailable.
fn again(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        e => StoreError::Backend(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use super::*;

    /// A shared store that counts in memory and records each draw's size.
    #[derive(Default)]
    struct Counter {
        last: AtomicU64,
        sizes: Mutex<Vec<u32>>,
        down: AtomicBool,
        hangs: AtomicBool,
    }

    #[async_trait::async_trait]
    impl SharedNumbers for Counter {
        async fn draw_seqs(&self, n: u32) -> Result<Vec<u64>, StoreError> {
            self.sizes.lock().push(n);
            tokio::time::sleep(Duration::from_millis(20)).await;
            if self.hangs.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            if self.down.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable("refused".into()));
            }
            let first = self.last.fetch_add(u64::from(n), Ordering::SeqCst) + 1;
            Ok((first..first + u64::from(n)).collect())
        }

        async fn next_prompt_number(&self, _owner: &str) -> Result<i64, StoreError> {
            Ok(7)
        }
    }

    async fn take(numbers: &Numbers, n: usize) -> Vec<u64> {
        let mut taken = Vec::new();
        for _ in 0..n {
            taken.push(numbers.next_seq().await.unwrap());
        }
        taken
    }

    #[tokio::test]
    async fn blocks_double_while_used_up_fresh_and_halve_when_left_stale() {
        let store = Arc::new(Counter::default());
        let numbers = Numbers::timed(Some(store.clone()), Duration::from_secs(3600), DRAW_TIMEOUT);
        assert_eq!(take(&numbers, 15).await, (1..=15).collect::<Vec<_>>());
        assert_eq!(*store.sizes.lock(), [1, 2, 4, 8]);

        let store = Arc::new(Counter::default());
        let numbers = Numbers::timed(Some(store.clone()), Duration::from_millis(500), DRAW_TIMEOUT);
        assert_eq!(take(&numbers, 2).await, [1, 2], "the second from a block of two (2, 3)");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert_eq!(take(&numbers, 1).await, [4], "3 went stale: never handed out, the next is above it");
        assert_eq!(*store.sizes.lock(), [1, 2, 1]);
    }

    #[tokio::test]
    async fn submissions_waiting_for_a_failed_draw_fail_with_it() {
        let store = Arc::new(Counter::default());
        store.down.store(true, Ordering::SeqCst);
        let numbers = Arc::new(Numbers::new(Some(store.clone())));
        let waiting = (0..5).map(|_| {
            let numbers = numbers.clone();
            tokio::spawn(async move { numbers.next_seq().await })
        });
        for answer in futures_util::future::join_all(waiting).await {
            assert!(matches!(answer.unwrap(), Err(StoreError::Unavailable(_))));
        }
        assert_eq!(store.sizes.lock().len(), 1, "one draw failed for all five");
        store.down.store(false, Ordering::SeqCst);
        assert_eq!(numbers.next_seq().await.unwrap(), 1, "a submission after the failure draws again");
    }

    #[tokio::test]
    async fn a_draw_that_hangs_fails_within_its_timeout() {
        let store = Arc::new(Counter::default());
        store.hangs.store(true, Ordering::SeqCst);
        let numbers = Numbers::timed(Some(store.clone()), FRESH, Duration::from_millis(100));
        // (The store would answer in an hour.)
        let answer = tokio::time::timeout(Duration::from_secs(60), numbers.next_seq()).await;
        assert!(matches!(answer, Ok(Err(StoreError::Unavailable(_)))), "failed by the draw's own timeout: {answer:?}");
        store.hangs.store(false, Ordering::SeqCst);
        assert_eq!(numbers.next_seq().await.unwrap(), 1, "and drawn again once the store answers");
        assert_eq!(*store.sizes.lock(), [1, 1], "the failed draw's size was not kept doubled");
    }

    #[tokio::test]
    async fn one_host_counts_in_memory() {
        let numbers = Numbers::new(None);
        numbers.start_seq_after(41);
        assert_eq!(take(&numbers, 2).await, [42, 43]);
        for (owner, wanted) in [("x", 0), ("x", 1), ("y", 0), ("x", 2)] {
            assert_eq!(numbers.next_prompt_number(owner).await.unwrap(), wanted);
        }
    }
}
