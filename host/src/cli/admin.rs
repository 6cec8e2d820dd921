//! The admin API's client for the CLI (`kiln accounts`, and the other
//! operator commands): where the server is (`--url`, `KILN_URL`) and the
//! operator token (`admin_token`, `KILN_ADMIN_TOKEN`), one request at a time.

use anyhow::{Context, bail};
use serde_json::Value;

/// Where and how to reach the admin API.
#[derive(Debug, clap::Args)]
pub struct AdminTarget {
    /// The server's base URL.
    #[arg(long, env = "KILN_URL", default_value = "http://127.0.0.1:8188")]
    pub url: String,
}

/// An admin API client.
pub struct AdminClient {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl AdminClient {
    /// A client for `target`, authenticated with the configured operator token.
    pub fn new(target: &AdminTarget, config: &crate::config::Config) -> anyhow::Result<AdminClient> {
        let token = config
            .admin_token
            .clone()
            .filter(|t| !t.is_empty())
            .context("set KILN_ADMIN_TOKEN (or admin_token in the config file) to the server's operator token")?;
        let http = reqwest::Client::builder().timeout(std::time::Duration::from_secs(30)).build()?;
        Ok(AdminClient { http, base: target.url.trim_end_matches('/').to_string(), token })
    }

    /// `method` on `path` (below `/admin`) with an optional JSON body; the
    /// response's JSON, or the server's error message.
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        self.send(method, path, |request| match body {
            Some(body) => request.json(&body),
            None => request,
        })
        .await
    }

    /// `POST` of the multipart `form` to `path` (below `/admin`), given
    /// `timeout` (a plugin compiles before the answer); as [`AdminClient::call`].
    pub async fn upload(&self, path: &str, form: reqwest::multipart::Form, timeout: std::time::Duration) -> anyhow::Result<Value> {
        self.send(reqwest::Method::POST, path, |request| request.multipart(form).timeout(timeout)).await
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder) -> anyhow::Result<Value> {
        let url = format!("{}/admin{path}", self.base);
        let request = body(self.http.request(method, &url).bearer_auth(&self.token));
        let response = request.send().await.with_context(|| format!("cannot reach {url}"))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let json: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if !status.is_success() {
            let message = json["error"]["message"].as_str().map_or_else(|| text.chars().take(200).collect(), str::to_string);
            bail!("{status}: {message}");
        }
        Ok(json)
    }
}
