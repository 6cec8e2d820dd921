//! The listing's query (`GET /jobs`): the raw query read strictly (no raw
//! `;`, every `%` escape two hex digits, UTF-8 once decoded), then `limit`,
//! `cursor`, `status` and the label filters (`labels::Filters`) into one
//! [`ListQuery`]. Other parameters are ignored.

use std::borrow::Cow;

use super::labels::{Filters, is_filter_name};
use crate::api::error::{ApiCode, ApiError};
use crate::service::ListQuery;
use crate::store::JobStatus;

/// The page size when `limit` is not given.
const DEFAULT_LIMIT: usize = 50;
/// The largest page.
const MAX_LIMIT: usize = 100;

/// The listing `raw` (the request's query, if any) asks for.
pub fn list_query(raw: Option<&str>) -> Result<ListQuery, ApiError> {
    let mut q = ListQuery { limit: DEFAULT_LIMIT, ..ListQuery::default() };
    let mut filters = Filters::default();
    for pair in raw.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (raw_name, raw_value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = decode(raw_name);
        // A filter's pair that cannot be read is a filter's error.
        let unreadable = |what: &str| {
            let code = if name.as_deref().is_some_and(is_filter_name) { ApiCode::InvalidMetadataFilter } else { ApiCode::InvalidRequest };
            ApiError::new(code, format!("The query parameter {pair:?} {what}."))
        };
        if pair.contains(';') {
            return Err(unreadable("holds a raw `;` (escape it as %3B)"));
        }
        let (Some(name), Some(value)) = (name.as_deref(), decode(raw_value)) else {
            return Err(unreadable("has a `%` escape that is not two hex digits or is not UTF-8"));
        };
        if filters.take(name, &value)? {
            continue;
        }
        match name {
            "limit" => {
                q.limit = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| ApiError::invalid_request(format!("`limit` must be an integer from 1 to {MAX_LIMIT}.")))?
            }
            "cursor" if value.is_empty() => {}
            "cursor" => q.cursor = Some(cursor(&value)?),
            "status" => {
                for s in value.split(',') {
                    let status = JobStatus::parse(s).ok_or_else(|| ApiError::invalid_request(format!("Unknown status {s:?}.")))?;
                    // Each once, however often asked for: at most every status.
                    if !q.statuses.contains(&status) {
                        q.statuses.push(status);
                    }
                }
            }
            _ => {}
        }
    }
    q.metadata = filters.into_pairs();
    Ok(q)
}

/// One side of a form pair, decoded: `+` is a space and each `%` escape is
/// a byte; `None` if an escape is not two hex digits or the bytes are not
/// UTF-8.
fn decode(raw: &str) -> Option<String> {
    let escapes_whole = raw.split('%').skip(1).all(|after| after.as_bytes().get(..2).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)));
    if !escapes_whole {
        return None;
    }
    percent_encoding::percent_decode_str(&raw.replace('+', " ")).decode_utf8().ok().map(Cow::into_owned)
}

/// An issued cursor: a job's creation time (8 bytes) and its store key, a
/// UUID or an owner-scoped one (`store::scoped_job_key`), in hex.
fn cursor(value: &str) -> Result<Vec<u8>, ApiError> {
    hex_decode(value)
        .filter(|b| b.len() > 8 && std::str::from_utf8(&b[8..]).is_ok_and(crate::store::is_job_key))
        .ok_or_else(|| ApiError::new(ApiCode::InvalidCursor, "The cursor was not issued by this server."))
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 512 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(raw: &str) -> ApiCode {
        list_query(Some(raw)).expect_err(raw).code
    }

    #[test]
    fn a_listing_query_is_read_strictly() {
        let q = list_query(Some("limit=7&status=queued,failed&metadata%5Bteam%5D=a+b%2Bc&clientId=x&&metadata[k]=%C3%A9")).unwrap();
        assert_eq!((q.limit, q.statuses, q.cursor), (7, vec![JobStatus::Queued, JobStatus::Failed], None));
        assert_eq!(q.metadata, [("team", "a b+c"), ("k", "é")].map(|(k, v)| (k.to_string(), v.to_string())));
        assert_eq!(list_query(None).unwrap().limit, DEFAULT_LIMIT);
        assert_eq!(list_query(Some("cursor=")).unwrap().cursor, None);
        let repeated = format!("status={}&status=failed", vec!["queued"; 10_000].join(","));
        assert_eq!(list_query(Some(&repeated)).unwrap().statuses, [JobStatus::Queued, JobStatus::Failed]);
        assert!(list_query(Some("metadata.x=1&metadata]=2&metadatax")).unwrap().metadata.is_empty(), "other parameters");
        for (raw, code) in [
            ("limit=0", ApiCode::InvalidRequest),
            ("limit=101", ApiCode::InvalidRequest),
            ("limit=", ApiCode::InvalidRequest),
            ("status=", ApiCode::InvalidRequest),
            ("status=bogus", ApiCode::InvalidRequest),
            ("cursor=zz", ApiCode::InvalidCursor),
            ("metadata=", ApiCode::InvalidMetadataFilter),
            ("status=queued&metadata=5", ApiCode::InvalidMetadataFilter),
            ("metadata[a]=1;metadata[b]=2", ApiCode::InvalidMetadataFilter),
            ("metadata[a]=%zz", ApiCode::InvalidMetadataFilter),
            ("metadata[a]=%4", ApiCode::InvalidMetadataFilter),
            ("metadata[a]=%ff", ApiCode::InvalidMetadataFilter),
            ("metadata[a]=%E2%80%AE", ApiCode::InvalidMetadataFilter),
            ("metadata[a]=1&metadata[a]=1", ApiCode::InvalidMetadataFilter),
            ("limit=5;x", ApiCode::InvalidRequest),
            ("other=%g0", ApiCode::InvalidRequest),
            ("metadatax=%zz", ApiCode::InvalidRequest),
            ("%6Detadata[a]=%zz", ApiCode::InvalidMetadataFilter),
            ("%zzmetadata[a]=1", ApiCode::InvalidRequest),
            ("cursor=%2B0", ApiCode::InvalidCursor),
        ] {
            assert_eq!(refused(raw), code, "{raw}");
        }
    }
}
