//! The service's Prometheus metrics: what `GET /metrics` shows.
//!
//! One registry per [`Service`](super::Service), not the process-wide
//! recorder of the `metrics` facade: a program that embeds two servers, or a
//! test binary that runs many, keeps each server's figures apart. This is
//! the one place a metric's name, help text and labels are spelled; other
//! layers call its typed methods. Every label takes values from a bounded
//! set: job statuses and surfaces, failure codes, the router's route
//! patterns (never the path a client sent), HTTP methods and statuses, and
//! node classes: the host's own plugins' by name, every other class
//! (an account's own plugins, a deployment's bundle) as `other` — a tenant
//! names its classes, and they are neither bounded by the operator nor
//! anyone else's to see. No job, node or account id is a label.
//!
//! Histograms keep their samples until they are folded into buckets: a
//! render does that, and so does [`Metrics::upkeep`], which the service
//! calls every [`UPKEEP_EVERY`] so an unscraped server's memory stays flat.

use std::time::Duration;

use metrics::{Key, KeyName, Label, Level, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

use crate::codes::JobErrorCode;
use crate::store::JobStatus;

/// How often histogram samples are folded into their buckets.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Bucket bounds of every duration histogram, in seconds: a request's
/// millisecond up to a long job's half hour.
const SECONDS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0];

static META: Metadata<'static> = Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

const JOBS_SUBMITTED: &str = "kiln_jobs_submitted_total";
const JOBS_ENDED: &str = "kiln_jobs_ended_total";
const QUEUE_WAIT: &str = "kiln_job_queue_wait_seconds";
const NODE_SECONDS: &str = "kiln_node_seconds";
const NODE_FAILURES: &str = "kiln_node_failures_total";
const HTTP_REQUESTS: &str = "kiln_http_requests_total";
const HTTP_SECONDS: &str = "kiln_http_request_seconds";
const CREDITS: &str = "kiln_credits_charged_total";
const QUEUED: &str = "kiln_jobs_queued";
const RUNNING: &str = "kiln_jobs_running";
const STREAMS: &str = "kiln_open_streams";
const RSS: &str = "kiln_resident_memory_bytes";
const BLOB_BYTES: &str = "kiln_blob_store_bytes";
const BLOBS: &str = "kiln_blob_store_blobs";

/// Figures read when the metrics are rendered rather than counted as they
/// change.
pub struct Gauges {
    /// Jobs waiting in this host's queue.
    pub queued: usize,
    /// Jobs running on this host.
    pub running: usize,
    /// Open `/api/v2` SSE streams.
    pub sse: usize,
    /// Open compatibility WebSockets.
    pub websockets: usize,
    /// The blob store at its last measurement (`None`: not measured by
    /// this host yet).
    pub blobs: Option<crate::store::BlobUsage>,
}

/// One service's metrics (see the module docs).
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let builder = PrometheusBuilder::new();
        // The bounds are a constant, non-empty list: this cannot fail, and
        // if it did the default (a summary) would still render.
        let builder = match builder.set_buckets(SECONDS) {
            Ok(with_buckets) => with_buckets,
            Err(e) => {
                tracing::error!(error = %e, "metrics: histogram buckets refused");
                PrometheusBuilder::new()
            }
        };
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        let metrics = Metrics { recorder, handle };
        metrics.describe();
        metrics
    }

    fn describe(&self) {
        let r = &self.recorder;
        let name = KeyName::from_const_str;
        let help = SharedString::const_str;
        r.describe_counter(name(JOBS_SUBMITTED), None, help("Jobs accepted by this host, by surface (v2, compat)."));
        r.describe_counter(name(JOBS_ENDED), None, help("Jobs this host moved to an end state, by status and surface."));
        r.describe_histogram(name(QUEUE_WAIT), Some(Unit::Seconds), help("Time from submission to start of the jobs this host started."));
        r.describe_histogram(name(NODE_SECONDS), Some(Unit::Seconds), help("Time of each node run, by class and where it ran (cpu, gpu)."));
        r.describe_counter(name(NODE_FAILURES), None, help("Node failures, by class and job error code."));
        r.describe_counter(name(HTTP_REQUESTS), None, help("HTTP requests answered, by method, route pattern and status."));
        r.describe_histogram(name(HTTP_SECONDS), Some(Unit::Seconds), help("Time to an HTTP response's headers, by method and route pattern."));
        r.describe_counter(name(CREDITS), None, help("Credits charged to accounts for executed time."));
        r.describe_gauge(name(QUEUED), None, help("Jobs waiting in this host's queue."));
        r.describe_gauge(name(RUNNING), None, help("Jobs running on this host."));
        r.describe_gauge(name(STREAMS), None, help("Open event streams, by kind (sse, websocket)."));
        r.describe_gauge(name(RSS), Some(Unit::Bytes), help("Resident memory of this process."));
        r.describe_gauge(name(BLOB_BYTES), Some(Unit::Bytes), help("Bytes in the blob store, measured by the sweeping host at most every 10 minutes."));
        r.describe_gauge(name(BLOBS), None, help("Blobs in the blob store, measured with kiln_blob_store_bytes."));
    }

    fn counter(&self, name: &'static str, labels: Vec<Label>) -> metrics::Counter {
        self.recorder.register_counter(&Key::from_parts(name, labels), &META)
    }

    fn histogram(&self, name: &'static str, labels: Vec<Label>) -> metrics::Histogram {
        self.recorder.register_histogram(&Key::from_parts(name, labels), &META)
    }

    fn gauge(&self, name: &'static str, labels: Vec<Label>) -> metrics::Gauge {
        self.recorder.register_gauge(&Key::from_parts(name, labels), &META)
    }

    /// A job was accepted through `surface` (as stored on its record).
    pub fn job_submitted(&self, surface: &str) {
        self.counter(JOBS_SUBMITTED, vec![Label::from_static_parts("surface", surface_label(surface))]).increment(1);
    }

    /// This host moved a job of `surface` to `status` (an end state).
    pub fn job_ended(&self, status: JobStatus, surface: &str) {
        let labels = vec![Label::from_static_parts("status", status.as_str()), Label::from_static_parts("surface", surface_label(surface))];
        self.counter(JOBS_ENDED, labels).increment(1);
    }

    /// This host started a job that waited `waited` since its submission.
    pub fn job_started(&self, waited: Duration) {
        self.histogram(QUEUE_WAIT, Vec::new()).record(waited.as_secs_f64());
    }

    /// A node of `class` ran for `elapsed_ms`, on the GPU or not.
    pub fn node_ran(&self, class: &str, on_gpu: bool, elapsed_ms: f64) {
        let labels = vec![Label::new("class", class.to_string()), Label::from_static_parts("device", if on_gpu { "gpu" } else { "cpu" })];
        self.histogram(NODE_SECONDS, labels).record(elapsed_ms / 1000.0);
    }

    /// A node of `class` failed with `code`.
    pub fn node_failed(&self, class: &str, code: JobErrorCode) {
        self.counter(NODE_FAILURES, vec![Label::new("class", class.to_string()), Label::from_static_parts("code", code.as_str())]).increment(1);
    }

    /// An HTTP request was answered. `route`: the router's pattern that
    /// matched (`None`: no route did — static files, unknown paths).
    pub fn http_request(&self, method: &axum::http::Method, route: Option<&str>, status: u16, elapsed: Duration) {
        let method = method_label(method);
        let route = SharedString::from(route.map(str::to_owned).unwrap_or_else(|| "unmatched".to_owned()));
        let status = SharedString::from(status.to_string());
        let labels = vec![Label::from_static_parts("method", method), Label::new("route", route.clone()), Label::new("status", status)];
        self.counter(HTTP_REQUESTS, labels).increment(1);
        self.histogram(HTTP_SECONDS, vec![Label::from_static_parts("method", method), Label::new("route", route)]).record(elapsed.as_secs_f64());
    }

    /// `credits` were charged to an account.
    pub fn credits_charged(&self, credits: i64) {
        if let Ok(credits) = u64::try_from(credits) {
            self.counter(CREDITS, Vec::new()).increment(credits);
        }
    }

    /// Folds histogram samples into their buckets.
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// The Prometheus text exposition, with `gauges` and this process's
    /// resident memory as of now.
    pub fn render(&self, gauges: Gauges) -> String {
        let set = |name: &'static str, labels: Vec<Label>, value: usize| self.gauge(name, labels).set(value as f64);
        set(QUEUED, Vec::new(), gauges.queued);
        set(RUNNING, Vec::new(), gauges.running);
        set(STREAMS, vec![Label::from_static_parts("kind", "sse")], gauges.sse);
        set(STREAMS, vec![Label::from_static_parts("kind", "websocket")], gauges.websockets);
        if let Some(rss) = resident_bytes() {
            self.gauge(RSS, Vec::new()).set(rss as f64);
        }
        if let Some(blobs) = gauges.blobs {
            self.gauge(BLOB_BYTES, Vec::new()).set(blobs.bytes as f64);
            self.gauge(BLOBS, Vec::new()).set(blobs.blobs as f64);
        }
        self.handle.render()
    }
}

/// The `class` label of nodes of classes the host's own plugins do not
/// define.
pub const OTHER_CLASS: &str = "other";

/// The `class` label of a node of `class`: its name when `host` (the
/// host's own plugins) defines it, else [`OTHER_CLASS`].
pub fn class_label<'a>(host: &crate::plugins::NodeRegistry, class: &'a str) -> &'a str {
    if host.get(class).is_some() { class } else { OTHER_CLASS }
}

/// The label of a stored surface name: one of two, whatever was stored.
fn surface_label(surface: &str) -> &'static str {
    match surface {
        "compat" => "compat",
        _ => "v2",
    }
}

/// The label of an HTTP method: the standard ones by name, any other as
/// `other` (a client may send any token as a method).
fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        _ => "other",
    }
}

/// This process's resident memory (Linux: `/proc/self/statm`).
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // The page size of every Linux platform kiln builds for but a few
    // arm64 kernels; those read larger.
    Some(pages * page_size())
}

fn page_size() -> u64 {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let size = unsafe { sysconf(SC_PAGESIZE) };
        if size > 0 {
            return size as u64;
        }
    }
    4096
}

#[cfg(all(unix, target_os = "linux"))]
const SC_PAGESIZE: std::ffi::c_int = 30;
#[cfg(all(unix, not(target_os = "linux")))]
const SC_PAGESIZE: std::ffi::c_int = 29;

#[cfg(unix)]
unsafe extern "C" {
    fn sysconf(name: std::ffi::c_int) -> std::ffi::c_long;
}

impl super::Service {
    /// This service's metrics, to count what happens at the edge.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The Prometheus text exposition of this service, as of now.
    pub fn render_metrics(&self) -> String {
        let all = self.streams.open_total();
        let sse = self.streams.open_events();
        let gauges =
            Gauges { queued: self.queue.waiting().queued(), running: self.sharing.busy(), sse, websockets: all.saturating_sub(sse), blobs: self.blob_usage() };
        self.metrics.render(gauges)
    }

    /// Folds histogram samples every [`UPKEEP_EVERY`] until shutdown.
    pub(super) async fn metrics_upkeep(self: std::sync::Arc<Self>) {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = every.tick() => self.metrics.upkeep(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_figure_is_rendered_with_its_labels() {
        let metrics = Metrics::new();
        metrics.job_submitted("compat");
        metrics.job_submitted("v2");
        metrics.job_submitted("something else");
        metrics.job_ended(JobStatus::Succeeded, "v2");
        metrics.node_ran("ImageInvert", false, 12.0);
        metrics.node_failed("ImageInvert", JobErrorCode::NodeTimeout);
        metrics.http_request(&axum::http::Method::GET, Some("/api/v2/jobs/{id}"), 200, Duration::from_millis(3));
        metrics.http_request(&axum::http::Method::from_bytes(b"BREW").unwrap(), None, 404, Duration::from_millis(1));
        metrics.credits_charged(7);
        metrics.credits_charged(-1);
        metrics.upkeep();
        let text = metrics.render(Gauges { queued: 3, running: 1, sse: 2, websockets: 5, blobs: Some(crate::store::BlobUsage { bytes: 4096, blobs: 2 }) });
        for line in [
            "kiln_jobs_submitted_total{surface=\"compat\"} 1",
            "kiln_jobs_submitted_total{surface=\"v2\"} 2",
            "kiln_jobs_ended_total{status=\"succeeded\",surface=\"v2\"} 1",
            "kiln_node_seconds_count{class=\"ImageInvert\",device=\"cpu\"} 1",
            "kiln_node_seconds_bucket{class=\"ImageInvert\",device=\"cpu\",le=\"0.025\"} 1",
            "kiln_node_seconds_bucket{class=\"ImageInvert\",device=\"cpu\",le=\"0.01\"} 0",
            "kiln_node_failures_total{class=\"ImageInvert\",code=\"node_timeout\"} 1",
            "kiln_http_requests_total{method=\"GET\",route=\"/api/v2/jobs/{id}\",status=\"200\"} 1",
            "kiln_http_requests_total{method=\"other\",route=\"unmatched\",status=\"404\"} 1",
            "kiln_credits_charged_total 7",
            "kiln_jobs_queued 3",
            "kiln_jobs_running 1",
            "kiln_open_streams{kind=\"sse\"} 2",
            "kiln_open_streams{kind=\"websocket\"} 5",
            "# HELP kiln_jobs_ended_total Jobs this host moved to an end state",
        ] {
            assert!(text.lines().any(|l| l.starts_with(line)), "no {line:?} in\n{text}");
        }
        let rss = text.lines().find_map(|l| l.strip_prefix("kiln_resident_memory_bytes ")).expect("rss");
        assert!(rss.parse::<f64>().unwrap() > 1e6, "{rss}");
    }

    #[test]
    fn two_services_keep_their_figures_apart() {
        let (a, b) = (Metrics::new(), Metrics::new());
        a.job_submitted("v2");
        let gauges = || Gauges { queued: 0, running: 0, sse: 0, websockets: 0, blobs: None };
        assert!(a.render(gauges()).contains("kiln_jobs_submitted_total{surface=\"v2\"} 1"));
        assert!(!b.render(gauges()).contains("kiln_jobs_submitted_total{surface"));
    }
}
