//! Schemas of the contract that no single wire type carries: the error
//! envelope and the code enums (from their one tables: `ApiCode::ALL`,
//! `JobErrorCode::ALL`, `JobStatus::ALL`), the request bodies the handlers
//! parse by hand, and the event stream's frames.

use std::borrow::Cow;

use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::{RefOr, SchemaFormat};
use utoipa::{PartialSchema, ToSchema};

use crate::api::error::ApiCode;
use crate::api::v2::labels::{MAX_FILTERS, MAX_KEY_CHARS, MAX_LABELS, MAX_VALUE_BYTES, key_pattern, value_pattern};
use crate::codes::JobErrorCode;
use crate::store::JobStatus;

/// A string schema whose values are `names`.
fn string_enum<'a>(description: &str, names: impl Iterator<Item = &'a str>) -> RefOr<Schema> {
    ObjectBuilder::new().schema_type(SchemaType::new(Type::String)).description(Some(description)).enum_values(Some(names)).into()
}

/// `PartialSchema` and `ToSchema` for a code enum: a string schema of
/// every variant's wire name, from the enum's own `ALL` table.
macro_rules! code_schema {
    ($ty:ty, $name:literal, $description:literal) => {
        impl PartialSchema for $ty {
            fn schema() -> RefOr<Schema> {
                string_enum($description, <$ty>::ALL.iter().map(|c| c.as_str()))
            }
        }
        impl ToSchema for $ty {
            fn name() -> Cow<'static, str> {
                $name.into()
            }
        }
    };
}

code_schema!(ApiCode, "ApiCode", "The code of an API error.");
code_schema!(JobErrorCode, "JobErrorCode", "Why a job failed.");
code_schema!(JobStatus, "JobStatus", "A job's status.");

/// An RFC 3339 timestamp (the schema of the views' `String` times).
pub fn timestamp() -> Schema {
    ObjectBuilder::new().schema_type(SchemaType::new(Type::String)).format(Some(SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::DateTime))).into()
}

/// An RFC 3339 timestamp or `null`.
pub fn maybe_timestamp() -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .format(Some(SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::DateTime)))
        .into()
}

/// A string schema with `pattern` and at most `max` characters.
fn constrained(description: &str, pattern: &str, min: usize, max: usize) -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::String))
        .description(Some(description))
        .pattern(Some(pattern))
        .min_length(Some(min))
        .max_length(Some(max))
        .into()
}

/// One path segment of a `file_path`: anything but a separator or NUL,
/// and not `..`.
const SEGMENT: &str = r"(?:[^/\\\x00.][^/\\\x00]*|\.(?:[^/\\\x00.][^/\\\x00]*)?|\.\.[^/\\\x00]+)";

/// A `file_path` (`api::v2::assets::check_file_path`).
pub fn file_path() -> Schema {
    constrained(
        "A relative path: no leading separator, no `..` segment, no NUL; 1 to 1024 characters.",
        &format!("^{SEGMENT}(?:[/\\\\](?:{SEGMENT})?)*$"),
        1,
        crate::api::v2::assets::MAX_FILE_PATH_CHARS,
    )
}

/// A tag (`api::v2::assets::add_tag`).
pub fn tag() -> Schema {
    constrained("1 to 64 characters, no control characters.", r"^[^\x00-\x1f\x7f-\x9f]+$", 1, crate::api::v2::assets::MAX_TAG_CHARS)
}

/// An upload's `content_type` (`api::v2::assets::check_media_type`): a
/// media type, or empty for `application/octet-stream`.
pub fn media_type() -> Schema {
    constrained(
        "A media type (`type/subtype`, parameters after `;`), or empty for application/octet-stream.",
        r"^$|^[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]*(;[ -~]*)?$",
        0,
        crate::api::v2::assets::MAX_MEDIA_TYPE_CHARS,
    )
}

/// Every error's body: `{"error": {"code", "message", "details"}}`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorEnvelope {
    error: ErrorBody,
}

/// The error itself.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct ErrorBody {
    code: ApiCode,
    /// For people; not stable.
    message: String,
    /// Structured detail where the code has some (the node errors of an
    /// invalid workflow, the missing assets), else `null`.
    details: Option<serde_json::Value>,
}

/// `POST /jobs`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct SubmitJob {
    /// The API-format graph: node id → `{class_type, inputs}`. Whether
    /// each node's inputs suit its class is checked against the server's
    /// node classes (422 `invalid_workflow`, each problem in `details`).
    #[schema(schema_with = workflow)]
    workflow: serde_json::Map<String, serde_json::Value>,
    #[schema(schema_with = metadata)]
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
    #[schema(schema_with = extra_data)]
    extra_data: Option<serde_json::Map<String, serde_json::Value>>,
}

fn workflow() -> Schema {
    let node = ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::Object))
        .property("class_type", ObjectBuilder::new().schema_type(SchemaType::new(Type::String)).min_length(Some(1)))
        .property("inputs", ObjectBuilder::new().schema_type(SchemaType::new(Type::Object)))
        .required("class_type")
        .required("inputs");
    ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::Object))
        .description(Some("The API-format graph: node id → `{class_type, inputs}`."))
        .min_properties(Some(1))
        .additional_properties(Some(node))
        .into()
}

/// A submission's `metadata` (`api::v2::labels`).
fn metadata() -> Schema {
    let description = format!(
        "Up to {MAX_LABELS} string labels: keys 1-{MAX_KEY_CHARS} of `[A-Za-z0-9_.-]`, values of at most {MAX_VALUE_BYTES} UTF-8 bytes without control or bidirectional formatting characters."
    );
    labels(ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::Object, Type::Null])).description(Some(description)).max_properties(Some(MAX_LABELS)))
}

/// The listing's `metadata[key]=value` filters (`api::v2::labels::Filters`).
pub struct MetadataFilters;

impl PartialSchema for MetadataFilters {
    fn schema() -> RefOr<Schema> {
        let description =
            format!("Up to {MAX_FILTERS} labels a job must carry, each with exactly this value (the labels' rule as in a submission's `metadata`).");
        labels(ObjectBuilder::new().schema_type(SchemaType::new(Type::Object)).description(Some(description)).max_properties(Some(MAX_FILTERS))).into()
    }
}

impl ToSchema for MetadataFilters {
    fn name() -> Cow<'static, str> {
        "MetadataFilters".into()
    }
}

/// `object` with the labels' rule: each key and each value kept.
fn labels(object: ObjectBuilder) -> Schema {
    // Bytes bound the value; a character is at least one.
    let value = constrained("A label's value.", &value_pattern(), 0, MAX_VALUE_BYTES);
    let mut schema = object.additional_properties(Some(value)).build();
    // JSON Schema's `propertyNames` (utoipa has no builder for it).
    schema.extensions.get_or_insert_default().insert("propertyNames".into(), serde_json::json!({ "type": "string", "pattern": key_pattern() }));
    schema.into()
}

/// `extra_data` (`api::v2::jobs::check_extra_data`).
fn extra_data() -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .description(Some("Only `api_key_svc_org`: the key partner nodes call their service with."))
        .property("api_key_svc_org", ObjectBuilder::new().schema_type(SchemaType::new(Type::String)))
        .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::FreeForm(false)))
        .into()
}

/// An SSE event: its name and its JSON `data` (see `x-events`).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct SseEvent {
    #[schema(schema_with = event_name)]
    event: String,
    /// The frame's JSON text.
    data: String,
}

fn event_name() -> Schema {
    ObjectBuilder::new().schema_type(SchemaType::new(Type::String)).enum_values(Some(["status", "progress", "output", "preview"])).into()
}

/// `POST /assets/from-hash`: a new asset record for bytes already stored.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct FromHash {
    /// `blake3:<64 hex digits>`.
    #[schema(pattern = "^blake3:[0-9a-fA-F]{64}$")]
    hash: String,
    #[schema(schema_with = file_path_or_null)]
    file_path: Option<String>,
    /// At most 64 tags.
    #[schema(schema_with = tags_or_null)]
    tags: Option<Vec<String>>,
    /// Retention in seconds (`api::v2::assets::EXPIRES_IN`).
    #[schema(schema_with = expires_in)]
    expires_in: Option<u64>,
}

/// `POST /assets` (multipart/form-data): a part left out is absent (a
/// part is text, so none is `null`); any other part is refused.
// (Deserialize only for `deny_unknown_fields`: the schema's
// `additionalProperties: false`.)
#[derive(serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct Upload {
    /// The bytes (one part).
    #[schema(value_type = String, format = Binary)]
    file: Vec<u8>,
    #[schema(schema_with = file_path)]
    file_path: String,
    #[schema(schema_with = media_type, nullable = false)]
    content_type: Option<String>,
    /// `blake3:<hex>`: the upload is refused (409 `hash_mismatch`) unless its bytes hash to it.
    #[schema(nullable = false)]
    expected_hash: Option<String>,
    /// One part per tag, at most 64.
    #[schema(schema_with = tags, nullable = false)]
    tags: Option<Vec<String>>,
    /// Retention in seconds (`api::v2::assets::EXPIRES_IN`).
    #[schema(schema_with = expires_in_part)]
    expires_in: Option<u64>,
}

fn nullable(schema: Schema) -> Schema {
    utoipa::openapi::schema::OneOfBuilder::new().item(schema).item(ObjectBuilder::new().schema_type(SchemaType::new(Type::Null))).into()
}

/// `expires_in` in seconds, from the range the handlers check.
fn expires_in_part() -> Schema {
    let range = crate::api::v2::assets::EXPIRES_IN;
    ObjectBuilder::new()
        .schema_type(SchemaType::new(Type::Integer))
        .description(Some(format!("Retention in seconds, {} to {}.", range.start(), range.end())))
        .minimum(Some(*range.start()))
        .maximum(Some(*range.end()))
        .into()
}

fn expires_in() -> Schema {
    nullable(expires_in_part())
}

fn file_path_or_null() -> Schema {
    nullable(file_path())
}

fn tags() -> Schema {
    utoipa::openapi::schema::ArrayBuilder::new().items(RefOr::T(tag())).max_items(Some(crate::service::MAX_ASSET_TAGS)).into()
}

fn tags_or_null() -> Schema {
    nullable(tags())
}

/// `POST /plugins` (multipart/form-data).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct PluginUpload {
    /// The plugin's `kiln-plugin.toml` text.
    manifest: String,
    /// The component (`.wasm`).
    #[schema(value_type = String, format = Binary)]
    component: Vec<u8>,
}

/// An installed plugin.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct PluginView {
    name: String,
    version: String,
    /// The component's hash.
    hash: String,
    /// The node classes it serves.
    classes: Vec<String>,
    /// Installed into the running host (else it came with the server); in
    /// listings only.
    installed: Option<bool>,
    /// What one node call of it may use, after the operator's ceilings; in
    /// listings only.
    memory_mb: Option<u64>,
    timeout_ms: Option<u64>,
    /// Whether it gets the GPU; in listings only.
    gpu: Option<bool>,
}

/// `GET /jobs/{id}/workflow`.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct WorkflowView {
    #[schema(value_type = Object)]
    workflow: serde_json::Map<String, serde_json::Value>,
    /// Always `api`.
    format: String,
}

/// A `preview` frame of the event stream.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct PreviewFrame {
    node_id: String,
    content_type: String,
    /// The image, base64.
    data_base64: String,
}

/// The event stream's catalogue (`x-events` of the stream operation): the
/// frames' names and what their `data` holds.
pub fn event_catalogue() -> serde_json::Value {
    serde_json::json!({
        "status": { "data": { "$ref": "#/components/schemas/JobView" }, "when": "first, on every status change, and last (a terminal status ends the stream)" },
        "progress": { "data": { "$ref": "#/components/schemas/ProgressSnapshot" }, "when": "while the job runs" },
        "output": { "data": { "$ref": "#/components/schemas/OutputView" }, "when": "once per output, every one before the terminal status" },
        "preview": { "data": { "$ref": "#/components/schemas/PreviewFrame" }, "when": "a running node's preview image" },
        "keepalive": { "comment": true, "when": "a `: keepalive` comment every sse_keepalive_s seconds (15 by default)" }
    })
}
