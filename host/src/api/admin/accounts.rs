//! `/admin/accounts`: create, list, show, credit, (de)activate the
//! subscription of, and disable accounts. Accounts are named by their
//! unique name in paths; a new account's key is in the create response
//! only.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value as Json_, json};

use crate::accounts::{Account, AccountError, Accounts};
use crate::api::AppState;
use crate::api::error::ApiError;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/admin/accounts", get(list).post(create))
        .route("/admin/accounts/{name}", get(show))
        .route("/admin/accounts/{name}/credits", post(credit))
        .route("/admin/accounts/{name}/subscription", post(subscription))
        .route("/admin/accounts/{name}/disable", post(disable))
}

/// An account as the admin API shows it (never its key hashes).
pub fn view(a: &Account) -> Json_ {
    json!({
        "id": a.id,
        "name": a.name,
        "credits": a.credits,
        "tier": a.tier,
        "subscription": if a.subscription_active { "active" } else { "inactive" },
        "disabled": a.disabled,
        "created_at": crate::api::v2::wire::timestamp(a.created_at),
    })
}

fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(b)| b).map_err(|e| ApiError::invalid_request(e.body_text()))
}

/// Runs an account write to its end on the blocking pool (the store makes
/// it durable before it returns).
async fn write<F>(state: &AppState, f: impl FnOnce(Arc<Accounts>) -> F + Send + 'static) -> Result<Json<Json_>, ApiError>
where
    F: std::future::Future<Output = Result<Arc<Account>, AccountError>>,
{
    let accounts = state.service.accounts().clone();
    let account = crate::api::pool::on_pool(move || f(accounts)).await??;
    Ok(Json(view(&account)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewAccount {
    name: String,
    #[serde(default)]
    credits: i64,
    tier: Option<String>,
}

async fn create(State(state): State<Arc<AppState>>, b: Result<Json<NewAccount>, JsonRejection>) -> Result<Response, ApiError> {
    let b = body(b)?;
    let accounts = state.service.accounts().clone();
    let (account, key) = crate::api::pool::on_pool(move || async move { accounts.create(&b.name, b.credits, b.tier.as_deref()).await }).await??;
    tracing::info!(account = %account.id, name = %account.name, "account created");
    Ok((StatusCode::CREATED, Json(json!({ "account": view(&account), "key": key }))).into_response())
}

async fn list(State(state): State<Arc<AppState>>) -> Json<Json_> {
    Json(json!({ "accounts": state.service.accounts().list().iter().map(|a| view(a)).collect::<Vec<_>>() }))
}

async fn show(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<Json_>, ApiError> {
    let account = state.service.accounts().by_name(&name).ok_or(AccountError::NotFound(name))?;
    Ok(Json(view(&account)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Credit {
    amount: i64,
}

async fn credit(State(state): State<Arc<AppState>>, Path(name): Path<String>, b: Result<Json<Credit>, JsonRejection>) -> Result<Json<Json_>, ApiError> {
    let amount = body(b)?.amount;
    write(&state, move |a| async move { a.add_credits(&name, amount).await }).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Subscription {
    active: bool,
}

async fn subscription(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    b: Result<Json<Subscription>, JsonRejection>,
) -> Result<Json<Json_>, ApiError> {
    let active = body(b)?.active;
    write(&state, move |a| async move { a.set_subscription(&name, active).await }).await
}

/// Disables an account: its keys answer 403 from now on, and what it has
/// going ends at once — its queued and running jobs are canceled (as a
/// client's cancel: a job that never started is not charged) and its open
/// SSE streams and WebSockets are closed.
async fn disable(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<Json_>, ApiError> {
    let service = state.service.clone();
    let account = crate::api::pool::on_pool(move || async move {
        let account = service.accounts().disable(&name).await?;
        service.end_account_work(&account.id).await;
        Ok::<_, AccountError>(account)
    })
    .await??;
    tracing::info!(account = %account.id, name = %account.name, "account disabled");
    Ok(Json(view(&account)))
}
