//! Open event streams: the `/api/v2` SSE streams and the compatibility
//! API's WebSocket connections, counted on the whole server
//! (`max_event_streams`) and per owner (`max_event_streams_per_account`,
//! with accounts), so one account never holds every slot. Each stream also
//! watches its owner's close signal: disabling an account ends its open
//! streams at once ([`StreamSlots::close_owner`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use tokio::sync::broadcast;

use super::{JobEvent, Service, ServiceError};
use crate::store::{JobRecord, JobStatus};

/// What kind of stream a slot holds (counted apart: the idle memory
/// trimmer waits for SSE streams, not for idle WebSockets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// A job's SSE stream (`/api/v2/jobs/{id}/events`).
    Events,
    /// A compatibility WebSocket (`/ws`).
    Socket,
}

/// One owner's open streams and the signal that closes them.
struct OwnerStreams {
    open: usize,
    closed: CancellationToken,
}

/// The stream slots of a server.
pub struct StreamSlots {
    max_total: usize,
    /// `None`: no bound per owner (a self-hosted server's one owner).
    max_per_owner: Option<usize>,
    total: AtomicUsize,
    events: AtomicUsize,
    owners: Mutex<HashMap<Arc<str>, OwnerStreams>>,
}

/// Holds one slot until dropped; [`StreamGuard::closed`] fires when the
/// owner's streams are closed.
pub struct StreamGuard {
    slots: Arc<StreamSlots>,
    owner: Arc<str>,
    kind: StreamKind,
    closed: CancellationToken,
}

impl StreamGuard {
    /// Cancelled when the stream must end now (its account was disabled).
    pub fn closed(&self) -> CancellationToken {
        self.closed.clone()
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut owners = self.slots.owners.lock();
        if let Some(entry) = owners.get_mut(&*self.owner) {
            entry.open = entry.open.saturating_sub(1);
            if entry.open == 0 {
                owners.remove(&*self.owner);
            }
        }
        self.slots.total.fetch_sub(1, Ordering::SeqCst);
        if self.kind == StreamKind::Events {
            self.slots.events.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl StreamSlots {
    pub fn new(max_total: usize, max_per_owner: Option<usize>) -> StreamSlots {
        StreamSlots { max_total, max_per_owner, total: AtomicUsize::new(0), events: AtomicUsize::new(0), owners: Mutex::default() }
    }

    /// Takes a slot for `owner`; 429 `too_many_streams` when the server or
    /// the owner has none left.
    pub fn open(self: &Arc<Self>, owner: &str, kind: StreamKind) -> Result<StreamGuard, ServiceError> {
        let mut owners = self.owners.lock();
        if self.total.load(Ordering::SeqCst) >= self.max_total {
            return Err(ServiceError::TooManyStreams);
        }
        let open = owners.get(owner).map_or(0, |e| e.open);
        if self.max_per_owner.is_some_and(|max| open >= max) {
            return Err(ServiceError::TooManyStreams);
        }
        let owner: Arc<str> = owners.get_key_value(owner).map_or_else(|| Arc::from(owner), |(key, _)| key.clone());
        let entry = owners.entry(owner.clone()).or_insert_with(|| OwnerStreams { open: 0, closed: CancellationToken::new() });
        entry.open += 1;
        let closed = entry.closed.clone();
        self.total.fetch_add(1, Ordering::SeqCst);
        if kind == StreamKind::Events {
            self.events.fetch_add(1, Ordering::SeqCst);
        }
        Ok(StreamGuard { slots: self.clone(), owner, kind, closed })
    }

    /// Ends every open stream of `owner` (their guards see
    /// [`StreamGuard::closed`]); returns how many were open. Streams opened
    /// later get a fresh signal.
    pub fn close_owner(&self, owner: &str) -> usize {
        let mut owners = self.owners.lock();
        match owners.get_mut(owner) {
            Some(entry) => {
                std::mem::replace(&mut entry.closed, CancellationToken::new()).cancel();
                entry.open
            }
            None => 0,
        }
    }

    /// Open SSE streams.
    pub fn open_events(&self) -> usize {
        self.events.load(Ordering::SeqCst)
    }

    /// Open streams of both kinds.
    pub fn open_total(&self) -> usize {
        self.total.load(Ordering::SeqCst)
    }

    /// Open streams of `owner`.
    pub fn open_of(&self, owner: &str) -> usize {
        self.owners.lock().get(owner).map_or(0, |e| e.open)
    }
}

/// An open event stream: the snapshot to send first, then live events.
pub struct EventStream {
    pub snapshot: JobRecord,
    pub queue_position: Option<usize>,
    pub progress: Option<crate::store::ProgressSnapshot>,
    pub preview: Option<JobEvent>,
    /// `None` when the job had already finished.
    pub events: Option<broadcast::Receiver<JobEvent>>,
    /// Holds the stream's slot; its `closed` signal ends the stream.
    pub guard: StreamGuard,
}

impl Service {
    /// Opens an event stream on a job (bounded by `max_event_streams`, and
    /// per account by `max_event_streams_per_account`).
    pub async fn open_stream(&self, owner: &str, id: &str) -> Result<EventStream, ServiceError> {
        let guard = self.streams.open(owner, StreamKind::Events)?;
        let key = self.job_key(owner, id).await;
        let id = key.as_str();
        self.activity.fetch_add(1, Ordering::Relaxed);
        if let Some(live) = self.live_job(id) {
            // Subscribe before the snapshot so nothing falls between them.
            let events = live.events.subscribe();
            let snapshot = live.snapshot();
            if snapshot.owner != owner {
                return Err(ServiceError::NotFound);
            }
            let queue_position = if snapshot.status == JobStatus::Queued { self.queue_position(id) } else { None };
            let progress = if snapshot.status == JobStatus::Running { snapshot.progress.clone() } else { None };
            let preview = live.last_preview.lock().clone();
            return Ok(EventStream { snapshot, queue_position, progress, preview, events: Some(events), guard });
        }
        // Another process may run it (a bus shared by several): followed
        // from before the snapshot, so nothing falls between them.
        let followed = self.bus.follow(id);
        let (snapshot, _) = self.get(owner, id).await?;
        let events = followed.filter(|_| !snapshot.status.is_terminal());
        if events.is_some() {
            self.bus.following(id);
        }
        let progress = if events.is_some() && snapshot.status == JobStatus::Running { snapshot.progress.clone() } else { None };
        Ok(EventStream { snapshot, queue_position: None, progress, preview: None, events, guard })
    }

    /// Notes that a request arrived (the idle memory trimmer waits for a
    /// quiet interval).
    pub fn touch(&self) {
        self.activity.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes a stream slot for a compatibility WebSocket of `owner` (the
    /// same bounds as event streams); the connection ends when its guard's
    /// `closed` signal fires.
    pub fn open_socket(&self, owner: &str) -> Result<StreamGuard, ServiceError> {
        self.activity.fetch_add(1, Ordering::Relaxed);
        self.streams.open(owner, StreamKind::Socket)
    }

    /// Open SSE event streams (WebSockets, which stay open while idle, are
    /// not counted here).
    pub fn open_streams(&self) -> usize {
        self.streams.open_events()
    }

    /// Open streams (SSE and WebSockets) of `owner`.
    pub fn open_streams_of(&self, owner: &str) -> usize {
        self.streams.open_of(owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_gets_its_share_and_the_server_bound_holds() {
        let slots = Arc::new(StreamSlots::new(5, Some(3)));
        let a: Vec<StreamGuard> = (0..3).map(|_| slots.open("a", StreamKind::Events).unwrap()).collect();
        assert!(matches!(slots.open("a", StreamKind::Socket), Err(ServiceError::TooManyStreams)), "a's share is 3");
        let b: Vec<StreamGuard> = (0..2).map(|_| slots.open("b", StreamKind::Socket).unwrap()).collect();
        assert!(matches!(slots.open("c", StreamKind::Events), Err(ServiceError::TooManyStreams)), "the server holds 5");
        assert_eq!((slots.open_events(), slots.open_of("a"), slots.open_of("b")), (3, 3, 2));
        drop(b);
        let c = slots.open("c", StreamKind::Events).unwrap();
        // Closing an owner fires its guards' signal, nobody else's.
        assert_eq!(slots.close_owner("a"), 3);
        assert!(a.iter().all(|g| g.closed().is_cancelled()));
        assert!(!c.closed().is_cancelled());
        drop(a);
        assert_eq!(slots.open_of("a"), 0);
        assert!(!slots.open("a", StreamKind::Events).unwrap().closed().is_cancelled(), "a later stream starts open");
    }
}
