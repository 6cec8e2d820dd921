//! The commit log's syncs for callers that must not wait for a disk (the
//! request runtime's workers, which answer every other request too) when
//! the device's flushes are slow.
//!
//! One thread runs the syncs. A caller sends it a request and awaits the
//! answer; the thread takes every request waiting, runs one sync of the log
//! (which covers every frame appended before it, so all of theirs), and
//! answers them all — the same group commit the log does for threads that
//! sync inline, without a request worker ever blocking on a device flush
//! (an `fdatasync` takes ~0.1 ms on a local SSD, tens of milliseconds on a
//! network volume).

use std::sync::Arc;
use std::sync::mpsc;

use tokio::sync::oneshot;

use crate::store::StoreError;
use crate::store::commit_log::CommitLog;

type Answer = oneshot::Sender<Result<(), StoreError>>;

/// Runs the log's syncs on its own thread; the thread ends with the last
/// handle.
pub(super) struct Syncer {
    requests: mpsc::Sender<Answer>,
}

impl Syncer {
    pub(super) fn start(log: Arc<CommitLog>) -> Result<Syncer, StoreError> {
        let (requests, incoming) = mpsc::channel::<Answer>();
        std::thread::Builder::new().name("kiln-log-sync".into()).spawn(move || {
            while let Ok(first) = incoming.recv() {
                let waiting: Vec<Answer> = std::iter::once(first).chain(incoming.try_iter()).collect();
                let synced = log.sync();
                for answer in waiting {
                    let _ = answer.send(match &synced {
                        Ok(()) => Ok(()),
                        Err(e) => Err(copy(e)),
                    });
                }
            }
        })?;
        Ok(Syncer { requests })
    }

    /// Returns once every frame appended before the call is durable.
    pub(super) async fn sync(&self) -> Result<(), StoreError> {
        let (answer, answered) = oneshot::channel();
        let gone = || StoreError::Backend("the commit log's sync thread is gone".into());
        self.requests.send(answer).map_err(|_| gone())?;
        answered.await.map_err(|_| gone())?
    }
}

/// One sync's error for each of its waiters (an I/O error keeps its kind: a
/// full disk stays `StorageFull`).
fn copy(e: &StoreError) -> StoreError {
    match e {
        StoreError::Io(io) => StoreError::Io(std::io::Error::new(io.kind(), io.to_string())),
        other => StoreError::Backend(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::durability::Durability;

    /// Syncs requested together share one, and every frame appended before
    /// a request is durable when it is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_share_syncs_and_their_frames_are_durable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("commit.log");
        let (log, _) = CommitLog::open(&path, Durability::PowerLoss).unwrap();
        let log = Arc::new(log);
        let syncer = Arc::new(Syncer::start(log.clone()).unwrap());
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let (log, syncer) = (log.clone(), syncer.clone());
                tokio::spawn(async move {
                    log.append(format!("f{i}").as_bytes(), false, || Ok(())).unwrap();
                    syncer.sync().await.unwrap();
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let syncs = log.syncs();
        assert!((1..=32).contains(&syncs), "{syncs} syncs for 32 waiters");
        drop((log, syncer));
        let (_, frames) = CommitLog::open(&path, Durability::PowerLoss).unwrap();
        assert_eq!(frames.len(), 32);
    }
}
