//! The service's own threads: one per job worker (each its own
//! single-threaded runtime, so nodes that compute never starve the HTTP
//! reactor, and waking a worker wakes no other thread — a multi-threaded
//! runtime woke a sibling to look for work it never had), the runtime a
//! job's parallel branches run on (every core; a chain runs on its
//! worker's thread), and the background tasks (the sweeper). This owns
//! starting nothing and stopping everything: the service starts them and
//! hands them here.

use parking_lot::Mutex;

/// The threads and tasks of a running service.
pub struct Threads {
    workers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    branches: Mutex<Option<tokio::runtime::Runtime>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Threads {
    /// The branch runtime, on every core; no workers or tasks yet.
    pub fn new() -> std::io::Result<Threads> {
        let branches = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(std::thread::available_parallelism().map_or(2, |n| n.get()))
            .thread_name("kiln-branch")
            .enable_all()
            .build()?;
        Ok(Threads { workers: Mutex::default(), branches: Mutex::new(Some(branches)), tasks: Mutex::default() })
    }

    /// Where a job's parallel branches run (`None` once stopped).
    pub fn branches(&self) -> Option<tokio::runtime::Handle> {
        self.branches.lock().as_ref().map(|rt| rt.handle().clone())
    }

    /// Keeps the started workers and background tasks until [`Threads::join`].
    pub fn keep(&self, workers: Vec<std::thread::JoinHandle<()>>, tasks: Vec<tokio::task::JoinHandle<()>>) {
        self.workers.lock().extend(workers);
        self.tasks.lock().extend(tasks);
    }

    /// Waits for the tasks and workers to return (the caller has told them
    /// to stop), then stops the branch runtime.
    pub async fn join(&self) {
        let tasks = std::mem::take(&mut *self.tasks.lock());
        for t in tasks {
            let _ = t.await;
        }
        // Each worker returns at its job's next yield (within an epoch tick).
        let workers = std::mem::take(&mut *self.workers.lock());
        let _ = tokio::task::spawn_blocking(move || workers.into_iter().for_each(|w| drop(w.join()))).await;
        if let Some(rt) = self.branches.lock().take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        if let Some(rt) = self.branches.get_mut().take() {
            rt.shutdown_background();
        }
    }
}
