//! `/admin/accounts`: create, list, show, credit, (de)activate the
//! subscription of, and disable accounts. Accounts are named by their
//! unique name in paths; a new account's key is in the create response
//! only.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value as Json_, json};
use utoipa_axum::router::UtoipaMethodRouter;
use utoipa_axum::routes;

use crate::accounts::{Account, AccountError, Accounts};
use crate::api::AppState;
use crate::api::error::ApiError;
use crate::api::v2::Segment;

/// The routes, each with its documentation (`api::openapi`).
pub fn routes() -> [UtoipaMethodRouter<Arc<AppState>>; 5] {
    [routes!(list, create), routes!(show), routes!(credit), routes!(subscription), routes!(disable)]
}

/// An account as the admin API shows it.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct AccountView {
    id: String,
    name: String,
    credits: i64,
    tier: Option<String>,
    /// `active` or `inactive`.
    subscription: String,
    disabled: bool,
    #[schema(schema_with = crate::api::openapi::schemas::timestamp)]
    created_at: String,
}

/// A new account and its key (shown only here).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct CreatedAccount {
    account: AccountView,
    key: String,
}

/// `GET /admin/accounts`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct AccountList {
    accounts: Vec<AccountView>,
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

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct NewAccount {
    name: String,
    #[serde(default)]
    credits: i64,
    tier: Option<String>,
}

#[utoipa::path(post, path = "/admin/accounts", operation_id = "create_account", tag = "accounts",
    request_body = NewAccount,
    responses((status = 201, description = "Created; `key` is shown only here.", body = CreatedAccount)))]
async fn create(State(state): State<Arc<AppState>>, b: Result<Json<NewAccount>, JsonRejection>) -> Result<Response, ApiError> {
    let b = body(b)?;
    let accounts = state.service.accounts().clone();
    let (account, key) = crate::api::pool::on_pool(move || async move { accounts.create(&b.name, b.credits, b.tier.as_deref()).await }).await??;
    tracing::info!(account = %account.id, name = %account.name, "account created");
    Ok((StatusCode::CREATED, Json(json!({ "account": view(&account), "key": key }))).into_response())
}

#[utoipa::path(get, path = "/admin/accounts", operation_id = "list_accounts", tag = "accounts",
    responses((status = 200, description = "Every account.", body = AccountList)))]
async fn list(State(state): State<Arc<AppState>>) -> Result<Json<Json_>, ApiError> {
    let service = state.service.clone();
    let accounts = crate::api::pool::on_pool(move || async move { service.accounts_shown().await }).await??;
    Ok(Json(json!({ "accounts": accounts.iter().map(|a| view(a)).collect::<Vec<_>>() })))
}

#[utoipa::path(get, path = "/admin/accounts/{name}", operation_id = "show_account", tag = "accounts", params(("name" = String, Path, description = "The account's name.")),
    responses((status = 200, description = "The account.", body = AccountView)))]
async fn show(State(state): State<Arc<AppState>>, Segment(name): Segment) -> Result<Json<Json_>, ApiError> {
    let service = state.service.clone();
    let account = crate::api::pool::on_pool(move || async move { service.account_shown(&name).await }).await??;
    Ok(Json(view(&account)))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct Credit {
    /// Added to the balance (negative: taken off).
    amount: i64,
}

#[utoipa::path(post, path = "/admin/accounts/{name}/credits", operation_id = "credit_account", tag = "accounts", params(("name" = String, Path, description = "The account's name.")),
    request_body = Credit,
    responses((status = 200, description = "The account after the change.", body = AccountView)))]
async fn credit(State(state): State<Arc<AppState>>, Segment(name): Segment, b: Result<Json<Credit>, JsonRejection>) -> Result<Json<Json_>, ApiError> {
    let amount = body(b)?.amount;
    write(&state, move |a| async move { a.add_credits(&name, amount).await }).await
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct Subscription {
    active: bool,
}

#[utoipa::path(post, path = "/admin/accounts/{name}/subscription", operation_id = "set_subscription", tag = "accounts", params(("name" = String, Path, description = "The account's name.")),
    request_body = Subscription,
    responses((status = 200, description = "The account after the change.", body = AccountView)))]
async fn subscription(
    State(state): State<Arc<AppState>>,
    Segment(name): Segment,
    b: Result<Json<Subscription>, JsonRejection>,
) -> Result<Json<Json_>, ApiError> {
    let active = body(b)?.active;
    write(&state, move |a| async move { a.set_subscription(&name, active).await }).await
}

/// Disables an account: its keys answer 403 from now on, and what it has
/// going ends at once — its queued and running jobs are canceled (as a
/// client's cancel: a job that never started is not charged) and its open
/// SSE streams and WebSockets are closed.
#[utoipa::path(post, path = "/admin/accounts/{name}/disable", operation_id = "disable_account", tag = "accounts", params(("name" = String, Path, description = "The account's name.")),
    responses((status = 200, description = "The account, disabled.", body = AccountView)))]
async fn disable(State(state): State<Arc<AppState>>, Segment(name): Segment) -> Result<Json<Json_>, ApiError> {
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
