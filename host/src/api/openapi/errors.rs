//! Which error codes each documented operation can answer: one table, by
//! operation id, plus the codes every operation can meet at the edge. The
//! document's error responses are generated from it (one response per
//! status, its description naming the codes, the body the envelope), so a
//! handler's `#[utoipa::path]` lists only its successes.

use std::collections::BTreeMap;

use utoipa::openapi::path::Operation;
use utoipa::openapi::schema::OneOfBuilder;
use utoipa::openapi::{ContentBuilder, HeaderBuilder, Ref, RefOr, ResponseBuilder};

use crate::api::error::ApiCode;

use ApiCode::*;

/// The codes each operation's own handler (and the service calls it
/// makes) can answer with, by operation id; their statuses and wire names
/// come from [`ApiCode`]. Every id names an operation of a document (a
/// test checks), and every operation not here answers only edge codes.
pub const TABLE: &[(&str, &[ApiCode])] = &[
    (
        "submit_job",
        &[
            InvalidRequest,
            InsufficientCredits,
            InvalidWorkflow,
            WorkflowFormatUi,
            MissingAsset,
            IdempotencyKeyReuse,
            DeploymentStopped,
            MetadataInvalid,
            // The body's memory estimate over `intake_memory_mb`.
            PayloadTooLarge,
            QueueFull,
            DeploymentNotReady,
        ],
    ),
    // (A body over the submission limit: the route's `invalid_workflow`.)
    ("list_jobs", &[InvalidRequest, InvalidCursor, InvalidMetadataFilter, InvalidWorkflow]),
    ("get_job", &[NotFound]),
    ("get_job_workflow", &[NotFound]),
    ("cancel_job", &[NotFound]),
    ("get_asset", &[NotFound]),
    ("job_events", &[NotFound, TooManyStreams]),
    ("upload_asset", &[InvalidRequest, HashMismatch, TooManyTags, StorageFull]),
    ("asset_from_hash", &[InvalidRequest, BlobNotFound, TooManyTags, StorageFull]),
    ("delete_asset", &[NotFound, AssetInUse]),
    ("asset_content", &[NotFound, RangeNotSatisfiable]),
    ("signed_asset_content", &[Forbidden, NotFound, RangeNotSatisfiable]),
    ("install_plugin", &[InvalidRequest, NotFound, Conflict, TooManyPlugins, PluginRefused, StorageFull]),
    ("list_plugins", &[NotFound]),
    ("remove_plugin", &[NotFound, Conflict]),
    ("install_host_plugin", &[InvalidRequest, NotFound, Conflict, PluginRefused, StorageFull]),
    ("remove_host_plugin", &[NotFound, Conflict]),
    ("create_account", &[InvalidRequest, NameTaken, TooManyAccounts]),
    ("show_account", &[NotFound]),
    ("disable_account", &[NotFound]),
    ("show_deployment", &[NotFound]),
    ("credit_account", &[InvalidRequest, NotFound]),
    ("set_subscription", &[InvalidRequest, NotFound]),
    ("stop_deployment", &[InvalidRequest, NotFound]),
    ("start_deployment", &[InvalidRequest, NotFound]),
    ("create_deployment", &[InvalidRequest, DeploymentExists, BundleRefused, StorageFull]),
];

/// The codes of `operation_id`'s own handler (see [`TABLE`]).
pub fn of_operation(operation_id: &str) -> &'static [ApiCode] {
    TABLE.iter().find(|(id, _)| *id == operation_id).map_or(&[], |(_, codes)| codes)
}

/// Operations whose route has no body limit (the documents).
fn unlimited(operation_id: &str) -> bool {
    matches!(operation_id, "openapi" | "admin_openapi")
}

/// Operations callers reach without credentials (`api::auth`'s list).
pub fn is_public(operation_id: &str) -> bool {
    crate::api::auth::PUBLIC_OPERATIONS.iter().any(|(id, _)| *id == operation_id)
}

/// The codes any operation can meet before or around its handler: a body
/// that stalls (`api::listener`), one over its route's limit (`BodyLimit`,
/// which refuses a declared length before reading), the credentials check
/// (when the server asks for them), a failure of the server itself, the
/// connection limits.
fn at_the_edge(operation_id: &str, authenticated: bool) -> Vec<ApiCode> {
    let mut codes = vec![RequestTimeout];
    // (The submission routes answer a body over the limit as a workflow over it.)
    if !unlimited(operation_id) && !matches!(operation_id, "submit_job" | "list_jobs") {
        codes.push(PayloadTooLarge);
    }
    if authenticated && !is_public(operation_id) {
        codes.extend([Unauthorized, Forbidden]);
    }
    codes.extend([UpstreamError, TooManyConnections]);
    codes
}

/// Adds `operation`'s error responses: one per status its codes have
/// (described by the codes' names, with the envelope as the body, and
/// `Retry-After` on 429 and 503), leaving any the handler documents.
pub fn add_responses(operation_id: &str, operation: &mut Operation, authenticated: bool) {
    let mut by_status: BTreeMap<u16, Vec<&'static str>> = BTreeMap::new();
    let edge = at_the_edge(operation_id, authenticated);
    for code in of_operation(operation_id).iter().chain(&edge) {
        let names = by_status.entry(code.status().as_u16()).or_default();
        if !names.contains(&code.as_str()) {
            names.push(code.as_str());
        }
    }
    for (status, names) in by_status {
        let key = status.to_string();
        let described = names
            .iter()
            .map(|n| match ApiCode::ALL.iter().find(|c| c.as_str() == *n).and_then(|c| meaning(*c)) {
                Some(meaning) => format!("`{n}` ({meaning})"),
                None => format!("`{n}`"),
            })
            .collect::<Vec<_>>()
            .join(", ");
        // A status the handler documents too (`ready`'s 503): its body, or the envelope.
        if let Some(RefOr::T(documented)) = operation.responses.responses.get_mut(&key) {
            documented.description = format!("{} Or an error: {described}.", documented.description);
            for content in documented.content.values_mut() {
                let RefOr::T(content) = content else { continue };
                if let Some(schema) = content.schema.take() {
                    content.schema = Some(OneOfBuilder::new().item(schema).item(Ref::from_schema_name("ErrorEnvelope")).into());
                }
            }
            continue;
        }
        let mut response = ResponseBuilder::new()
            .description(format!("An error: {described}."))
            .content("application/json", ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorEnvelope"))).build());
        if status == 429 || status == 503 {
            response =
                response.header("Retry-After", HeaderBuilder::new().schema(Some(u64_schema())).description(Some("Seconds to wait before retrying.")).build());
        }
        operation.responses.responses.insert(key, response.build().into());
    }
}

/// What a code means where its name does not say it all.
fn meaning(code: ApiCode) -> Option<&'static str> {
    Some(match code {
        InvalidRequest => "a body that is not JSON or not of the documented shape, a malformed multipart body, a bad header or parameter",
        RequestTimeout => "the request body stopped arriving",
        PayloadTooLarge => "the body is over its limit",
        StorageFull => "the server's disk is full",
        UpstreamError => "an unexpected failure; the cause is logged, not sent",
        TooManyConnections => "the server is at its connection limits",
        Unauthorized => "no credentials, or wrong ones",
        Forbidden => "credentials that may not do this (a disabled account, another account's deployment)",
        _ => return None,
    })
}

fn u64_schema() -> utoipa::openapi::schema::Schema {
    utoipa::openapi::ObjectBuilder::new().schema_type(utoipa::openapi::schema::SchemaType::new(utoipa::openapi::schema::Type::Integer)).minimum(Some(0)).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_of_an_operation_is_named_by_its_codes() {
        let mut op = Operation::new();
        add_responses("submit_job", &mut op, true);
        let statuses: Vec<&str> = op.responses.responses.keys().map(String::as_str).collect();
        assert_eq!(statuses, ["400", "401", "402", "403", "408", "413", "422", "429", "500", "503"]);
        let json = serde_json::to_value(&op).unwrap();
        let unprocessable = json["responses"]["422"]["description"].as_str().unwrap();
        for code in ["invalid_workflow", "missing_asset", "idempotency_key_reuse", "metadata_invalid"] {
            assert!(unprocessable.contains(code), "{unprocessable}");
        }
        assert!(json["responses"]["429"]["headers"].get("Retry-After").is_some(), "{json}");
        // A public operation does not answer for credentials.
        let mut public = Operation::new();
        add_responses("health", &mut public, true);
        assert!(!public.responses.responses.contains_key("401"));
    }
}
