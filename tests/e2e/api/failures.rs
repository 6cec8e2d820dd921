//! Store failures. Unknown outcomes: a store that commits but cannot make a
//! write durable — the client gets a generic 500 `upstream_error`, the job
//! still runs, and its Idempotency-Key stays claimed (rule 5). Definite
//! ones: a submission that was not written never runs and frees its key,
//! and a cancel that was not written leaves its job queued.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use kiln::store::{AssetRecord, IdempotencyClaim, JobFilter, JobPage, JobRecord, MetaStore, Micros, SledMeta, StoreError};
use serde_json::json;

use super::{TestServer, trivial};

/// sled, except that a submission can be made to fail after its commit
/// (`fail`) or slowly without being written (`reject`), and a job's
/// terminal write can be held back.
struct NotDurable {
    inner: SledMeta,
    fail: AtomicBool,
    reject: AtomicBool,
    hold_finish: AtomicBool,
    /// A canceled record's write fails.
    reject_cancel: AtomicBool,
    /// Asset records read (`get_asset`).
    asset_reads: AtomicUsize,
    /// Asset records written (`put_asset`, `update_asset`).
    asset_writes: AtomicUsize,
    /// Job records listings returned (`list_jobs`).
    jobs_listed: AtomicUsize,
    /// Job records read one by one (`get_job`).
    jobs_read: AtomicUsize,
}

#[async_trait::async_trait]
impl MetaStore for NotDurable {
    async fn submit(&self, job: &JobRecord, workflow: &serde_json::Value, claim: Option<&IdempotencyClaim>) -> Result<(), StoreError> {
        if self.reject.load(Ordering::SeqCst) {
            // Long enough for the woken worker to be waiting on the job.
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
            return Err(StoreError::Backend("injected: the write failed".into()));
        }
        self.inner.submit(job, workflow, claim).await?;
        if self.fail.load(Ordering::SeqCst) { Err(StoreError::NotDurable("injected: the disk did not answer".into())) } else { Ok(()) }
    }
    async fn put_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        if job.status == kiln::store::JobStatus::Canceled && self.reject_cancel.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("injected: the write failed".into()));
        }
        self.inner.put_job(job).await
    }
    async fn get_job(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        self.jobs_read.fetch_add(1, Ordering::SeqCst);
        self.inner.get_job(id).await
    }
    async fn delete_job(&self, job: &JobRecord) -> Result<(), StoreError> {
        self.inner.delete_job(job).await
    }
    async fn get_workflow(&self, id: &str) -> Result<Option<serde_json::Value>, StoreError> {
        self.inner.get_workflow(id).await
    }
    async fn list_jobs(
        &self,
        owner: Option<&str>,
        cursor: Option<&[u8]>,
        limit: usize,
        max_scanned: usize,
        keep: &JobFilter<'_>,
    ) -> Result<JobPage, StoreError> {
        let page = self.inner.list_jobs(owner, cursor, limit, max_scanned, keep).await?;
        self.jobs_listed.fetch_add(page.jobs.len(), Ordering::SeqCst);
        Ok(page)
    }
    async fn get_workflow_bytes(&self, id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get_workflow_bytes(id).await
    }
    async fn unfinished_jobs(&self) -> Result<Vec<JobRecord>, StoreError> {
        self.inner.unfinished_jobs().await
    }
    async fn max_seq(&self) -> Result<u64, StoreError> {
        self.inner.max_seq().await
    }
    async fn check_writable(&self) -> Result<(), StoreError> {
        if self.reject.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("injected: the write failed".into()));
        }
        self.inner.check_writable().await
    }
    async fn jobs_due(&self, now: Micros, purge_before: Micros, limit: usize) -> Result<Vec<JobRecord>, StoreError> {
        self.inner.jobs_due(now, purge_before, limit).await
    }
    async fn record_start(&self, job: &JobRecord) -> Result<(), StoreError> {
        self.inner.record_start(job).await
    }
    async fn put_asset(&self, asset: &AssetRecord) -> Result<(), StoreError> {
        self.asset_writes.fetch_add(1, Ordering::SeqCst);
        self.inner.put_asset(asset).await
    }
    async fn update_asset(&self, asset: &AssetRecord) -> Result<bool, StoreError> {
        self.asset_writes.fetch_add(1, Ordering::SeqCst);
        self.inner.update_asset(asset).await
    }
    async fn get_asset(&self, id: &str) -> Result<Option<AssetRecord>, StoreError> {
        self.asset_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.get_asset(id).await
    }
    async fn delete_asset(&self, asset: &AssetRecord) -> Result<(), StoreError> {
        self.inner.delete_asset(asset).await
    }
    async fn change_asset(&self, id: &str, change: kiln::store::AssetChange) -> Result<Option<AssetRecord>, StoreError> {
        self.inner.change_asset(id, change).await
    }
    async fn delete_expired_upload(&self, asset: &AssetRecord, now: kiln::store::Micros) -> Result<Option<AssetRecord>, StoreError> {
        self.inner.delete_expired_upload(asset, now).await
    }
    async fn assets_with_hash(&self, hash: &str) -> Result<Vec<AssetRecord>, StoreError> {
        self.inner.assets_with_hash(hash).await
    }
    async fn assets_of_job(&self, job_id: &str) -> Result<Vec<AssetRecord>, StoreError> {
        self.inner.assets_of_job(job_id).await
    }
    async fn uploads_due(&self, now: Micros, limit: usize) -> Result<Vec<AssetRecord>, StoreError> {
        self.inner.uploads_due(now, limit).await
    }
    async fn assets_tagged(&self, prefix: &str) -> Result<Vec<AssetRecord>, StoreError> {
        self.inner.assets_tagged(prefix).await
    }
    async fn get_claim(&self, key: &str) -> Result<Option<IdempotencyClaim>, StoreError> {
        self.inner.get_claim(key).await
    }
    async fn purge_claims(&self, now: Micros) -> Result<usize, StoreError> {
        self.inner.purge_claims(now).await
    }
    async fn finish_job(&self, job: &JobRecord, assets: &[AssetRecord]) -> Result<(), StoreError> {
        while self.hold_finish.load(Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        self.inner.finish_job(job, assets).await
    }
    async fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush().await
    }
    async fn finished_changes(&self, owner: &str) -> Result<u64, StoreError> {
        self.inner.finished_changes(owner).await
    }
}

/// A server on the `NotDurable` store.
async fn start_not_durable(fail: bool, hold_finish: bool) -> (TestServer, Arc<NotDurable>) {
    let mut store = None;
    let s = super::start_on_backends(|data| {
        let meta = Arc::new(NotDurable {
            inner: SledMeta::open(&data.join("meta")).unwrap(),
            fail: AtomicBool::new(fail),
            reject: AtomicBool::new(false),
            hold_finish: AtomicBool::new(hold_finish),
            reject_cancel: AtomicBool::new(false),
            asset_reads: AtomicUsize::new(0),
            asset_writes: AtomicUsize::new(0),
            jobs_listed: AtomicUsize::new(0),
            jobs_read: AtomicUsize::new(0),
        });
        store = Some(meta.clone());
        let blobs = Arc::new(kiln::store::DiskBlobs::open(data.join("blobs")).unwrap());
        kiln::service::Backends::with_stores(meta, blobs, data).unwrap()
    })
    .await;
    (s, store.unwrap())
}

#[tokio::test]
async fn an_unknown_outcome_is_a_generic_500_and_keeps_the_key_claimed() {
    let (s, meta) = start_not_durable(true, false).await;

    let body = json!({ "workflow": trivial(77), "metadata": { "probe": "unknown" } });
    let (status, err, _) = s.post_job(&body, Some("key-unknown")).await;
    assert_eq!((status, err["error"]["code"].as_str()), (500, Some("upstream_error")), "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(!message.contains("injected") && !message.contains("disk"), "no internals on the wire: {message}");
    // The job was committed, so it exists and runs.
    let (_, page) = s.get("/jobs?metadata%5Bprobe%5D=unknown").await;
    let jobs = page["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{page}");
    assert_eq!(s.wait(jobs[0]["id"].as_str().unwrap()).await["status"], "succeeded");
    // The key stays claimed: a retry is refused rather than run twice.
    meta.fail.store(false, Ordering::SeqCst);
    let (status, err, _) = s.post_job(&body, Some("key-unknown")).await;
    assert_eq!((status, err["error"]["code"].as_str()), (422, Some("idempotency_key_reuse")));
    assert_eq!(s.get("/jobs?metadata%5Bprobe%5D=unknown").await.1["jobs"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn a_finished_job_is_shown_done_only_once_that_is_durable() {
    let (s, meta) = start_not_durable(false, true).await;
    let id = s.submit(trivial(78)).await["id"].as_str().unwrap().to_string();
    // The run is over (its output is on the live record) but its terminal
    // write is held: polls, listings and a new event stream still say running.
    let mut job = s.job(&id).await;
    for _ in 0..500 {
        if job["outputs"].as_array().is_some_and(|o| o.len() == 1) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        job = s.job(&id).await;
    }
    assert_eq!(job["outputs"].as_array().map(Vec::len), Some(1), "{job}");
    let mut events = s.http.get(s.url(&format!("/jobs/{id}/events"))).send().await.unwrap();
    for _ in 0..20 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        assert_eq!(s.job(&id).await["status"], "running");
        let listed = s.get("/jobs").await.1;
        assert_eq!(listed["jobs"][0]["status"], "running", "{listed}");
    }
    let mut seen = String::new();
    while let Ok(Some(chunk)) = tokio::time::timeout(std::time::Duration::from_millis(100), events.chunk()).await.unwrap_or(Ok(None)) {
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("\"status\":\"running\"") && !seen.contains("succeeded"), "{seen}");
    assert!(seen.contains("event: output"), "a stream opened after an output still gets it: {seen}");
    // Released: durable, then shown; the stream ends with it, each output sent once.
    meta.hold_finish.store(false, Ordering::SeqCst);
    assert_eq!(s.wait(&id).await["status"], "succeeded");
    while let Some(chunk) = events.chunk().await.unwrap() {
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert_eq!(seen.matches("event: output").count(), 1, "{seen}");
    assert!(seen.trim_end().ends_with("}") && seen.contains("\"status\":\"succeeded\""), "{seen}");
}

/// A cancel of a queued job whose write fails is a 500, and the job stays
/// queued as the store holds it: it runs in its turn.
#[tokio::test]
async fn a_cancel_that_was_not_written_leaves_the_job_queued() {
    let (s, meta) = start_not_durable(false, true).await;
    // Both workers hold a finished run (its end's write held back).
    let busy = [s.submit(trivial(80)).await, s.submit(trivial(81)).await];
    let queued = s.submit(trivial(82)).await["id"].as_str().unwrap().to_string();
    assert_eq!(s.job(&queued).await["status"], "queued");
    meta.reject_cancel.store(true, Ordering::SeqCst);
    let resp = s.http.post(s.url(&format!("/jobs/{queued}/cancel"))).send().await.unwrap();
    assert_eq!(resp.status(), 500);
    assert_eq!(s.job(&queued).await["status"], "queued", "not canceled: the store did not take it");
    meta.reject_cancel.store(false, Ordering::SeqCst);
    meta.hold_finish.store(false, Ordering::SeqCst);
    for job in &busy {
        assert_eq!(s.wait(job["id"].as_str().unwrap()).await["status"], "succeeded");
    }
    assert_eq!(s.wait(&queued).await["status"], "succeeded", "it ran in its turn");
}

#[tokio::test]
async fn a_submission_that_was_not_written_never_runs_and_frees_its_key() {
    let (s, meta) = start_not_durable(false, false).await;
    meta.reject.store(true, Ordering::SeqCst);
    let body = json!({ "workflow": trivial(79), "metadata": { "probe": "rejected" } });
    let (status, err, _) = s.post_job(&body, Some("key-rejected")).await;
    assert_eq!((status, err["error"]["code"].as_str()), (500, Some("upstream_error")), "{err}");
    assert!(!err["error"]["message"].as_str().unwrap().contains("injected"), "{err}");
    // The worker woken for it skipped it: nothing ran, nothing is listed,
    // no output was stored.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(s.get("/jobs?metadata%5Bprobe%5D=rejected").await.1["jobs"].as_array().unwrap().is_empty());
    assert!(s.get("/jobs").await.1["jobs"].as_array().unwrap().is_empty());
    assert_eq!(meta.asset_writes.load(Ordering::SeqCst), 0, "no output was stored");
    assert!(meta.unfinished_jobs().await.unwrap().is_empty());
    let stored_jobs = meta.list_jobs(None, None, 100, usize::MAX, &|_| true).await.unwrap().jobs;
    assert!(stored_jobs.is_empty(), "no record of it either: {:?}", stored_jobs.iter().map(|j| (&j.id, j.status)).collect::<Vec<_>>());
    // A definite failure frees the key, and the workers still take jobs.
    meta.reject.store(false, Ordering::SeqCst);
    let (status, job, _) = s.post_job(&body, Some("key-rejected")).await;
    assert_eq!(status, 201, "{job}");
    assert_eq!(s.wait(job["id"].as_str().unwrap()).await["status"], "succeeded");
    assert_eq!(s.get("/jobs").await.1["jobs"].as_array().unwrap().len(), 1);
}

/// Readiness follows the store: 503 `not_ready` while it takes no write
/// (checked again after at most a second), 200 once it does; `/health`
/// answers 200 throughout. Neither needs a token.
#[tokio::test]
async fn readiness_is_503_while_the_store_takes_no_write() {
    let (s, meta) = start_not_durable(false, false).await;
    let ready = |s: &TestServer| {
        let url = s.url("/ready");
        let http = s.http.clone();
        async move {
            let resp = http.get(url).send().await.unwrap();
            (resp.status().as_u16(), resp.json::<serde_json::Value>().await.unwrap())
        }
    };
    let (status, body) = ready(&s).await;
    assert_eq!((status, body["status"].as_str(), body["checks"]["store"].as_str()), (200, Some("ready"), Some("writable")), "{body}");
    meta.reject.store(true, Ordering::SeqCst);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let (status, body) = ready(&s).await;
    assert_eq!((status, body["status"].as_str(), body["checks"]["store"].as_str()), (503, Some("not_ready"), Some("not writable")), "{body}");
    assert!(!body.to_string().contains("injected"), "the store's error stays in the log: {body}");
    assert_eq!(s.http.get(s.url("/health")).send().await.unwrap().status(), 200);
    meta.reject.store(false, Ordering::SeqCst);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(ready(&s).await.0, 200);
}

/// `/history` and `/api/jobs` show each output's subfolder from the job's
/// record: no asset record is read to list them.
#[tokio::test]
async fn listings_show_output_subfolders_without_reading_assets() {
    let (s, meta) = start_not_durable(false, false).await;
    let origin = s.server.url();
    let mut workflow = trivial(5);
    workflow["2"]["inputs"]["filename_prefix"] = json!("shots/day1/t");
    let queued: serde_json::Value =
        s.http.post(format!("{origin}/api/prompt")).json(&json!({ "prompt": workflow })).send().await.unwrap().json().await.unwrap();
    let id = queued["prompt_id"].as_str().unwrap().to_string();
    assert_eq!(s.wait(&id).await["status"], "succeeded");
    meta.asset_reads.store(0, Ordering::SeqCst);
    let history: serde_json::Value = s.http.get(format!("{origin}/api/history")).send().await.unwrap().json().await.unwrap();
    let images = &history[&id]["outputs"]["2"]["images"];
    assert_eq!(images[0]["subfolder"], "shots/day1", "{history}");
    let jobs: serde_json::Value = s.http.get(format!("{origin}/api/jobs")).send().await.unwrap().json().await.unwrap();
    assert_eq!(jobs["jobs"][0]["preview_output"]["subfolder"], "shots/day1", "{jobs}");
    assert_eq!(meta.asset_reads.load(Ordering::SeqCst), 0, "no asset record read");
}

/// `/history?max_items=N` reads the newest N records, not the whole
/// history window; `/history?offset=` and `/api/jobs` read the window
/// once per change of the owner's history and then only their page.
#[tokio::test]
async fn history_pages_read_only_their_own_records() {
    let (s, meta) = start_not_durable(false, false).await;
    let origin = s.server.url();
    let run = |n: i64| {
        let (s, origin) = (&s, origin.clone());
        async move {
            let queued: serde_json::Value =
                s.http.post(format!("{origin}/api/prompt")).json(&json!({ "prompt": trivial(n) })).send().await.unwrap().json().await.unwrap();
            let id = queued["prompt_id"].as_str().unwrap().to_string();
            assert_eq!(s.wait(&id).await["status"], "succeeded");
            id
        }
    };
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(run(20 + n).await);
    }
    let reads = || (meta.jobs_listed.swap(0, Ordering::SeqCst), meta.jobs_read.swap(0, Ordering::SeqCst));
    let get = |path: &str| {
        let url = format!("{origin}{path}");
        let http = s.http.clone();
        async move { http.get(url).send().await.unwrap().json::<serde_json::Value>().await.unwrap() }
    };
    reads();
    let last = get("/history?max_items=2").await;
    assert_eq!(last.as_object().unwrap().len(), 2, "{last}");
    assert_eq!(reads().0, 2, "two records listed for two items");

    // The first page with an offset reads the window (5) and its own record.
    let page = get("/history?max_items=1&offset=1").await;
    assert_eq!(page.as_object().unwrap().keys().collect::<Vec<_>>(), vec![&ids[1]], "offset counts from the oldest");
    assert_eq!(reads(), (5, 1));
    // Every later page, and /api/jobs, reads no more than its page.
    let page = get("/history?max_items=2&offset=3").await;
    let mut keys: Vec<&String> = page.as_object().unwrap().keys().collect();
    keys.sort();
    let mut want = vec![&ids[3], &ids[4]];
    want.sort();
    assert_eq!(keys, want);
    assert_eq!(reads(), (0, 2));
    let jobs = get("/api/jobs?limit=2&offset=1").await;
    assert_eq!(jobs["pagination"]["total"], 5, "{jobs}");
    assert_eq!(jobs["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap()).collect::<Vec<_>>(), vec![&ids[3], &ids[2]], "newest first");
    assert_eq!(reads(), (0, 0), "/api/jobs renders the kept short records");
    let detail = get(&format!("/api/jobs/{}", ids[3])).await;
    assert_eq!(jobs["jobs"][0]["outputs_count"], detail["outputs_count"], "the short record keeps the count");
    assert_eq!(jobs["jobs"][0]["preview_output"], detail["preview_output"], "and the first output");

    // A finished job changes the history: the next request reads it again, and sees it.
    ids.push(run(40).await);
    reads();
    let jobs = get("/api/jobs?limit=1").await;
    assert_eq!((jobs["pagination"]["total"].as_u64(), jobs["jobs"][0]["id"].as_str()), (Some(6), Some(ids[5].as_str())), "{jobs}");
    assert_eq!(reads().0, 6);
    // So does one that leaves it.
    let deleted = s.http.post(format!("{origin}/history")).json(&json!({ "delete": [ids[0]] })).send().await.unwrap();
    assert_eq!(deleted.status(), 200);
    let page = get("/history?offset=0&max_items=100").await;
    assert_eq!(page.as_object().unwrap().len(), 5, "{page}");
    assert!(!page.as_object().unwrap().contains_key(&ids[0]));
}
