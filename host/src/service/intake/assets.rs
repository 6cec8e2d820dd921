//! Asset references in a submitted graph: every `core/ASSET` reference,
//! anywhere in the graph, is resolved to the name the job reads it under.
//! Side-effect free (the store is only read).

use serde_json::Value as Json;

use crate::service::ServiceError;
use crate::store::{AssetRecord, JobInput, MetaStore, Micros};

/// The marker of an asset reference inside a workflow.
pub const ASSET_TYPE: &str = "core/ASSET";

/// A workflow whose asset references are resolved.
pub struct Resolved {
    pub workflow: Json,
    pub inputs: Vec<JobInput>,
}

/// Replaces every `{"__type": "core/ASSET", "info": {...}}` in `workflow`
/// by the name its asset is readable under. References that are malformed,
/// unknown, expired or not owned by `owner` are collected into
/// [`ServiceError::MissingAsset`].
/// The graph is changed in place (a submitted graph may be large: it is
/// never copied): one pass collects the references, the store is asked for
/// each asset named once, a second pass writes the names.
pub async fn resolve_assets(workflow: Json, meta: &dyn MetaStore, owner: &str, now: Micros) -> Result<Resolved, ServiceError> {
    let mut out = workflow;
    // `info.id` must name an asset the caller owns; `hash` and `file_path`
    // are hints and never stand in for it.
    let mut refs: Vec<Result<String, &'static str>> = Vec::new();
    walk(&mut out, &mut |value| {
        let id = match value.get("info").and_then(Json::as_object) {
            None => Err("(reference without info)"),
            Some(info) => info.get("id").and_then(Json::as_str).map(str::to_string).ok_or("(reference without id)"),
        };
        refs.push(id);
        Ok(())
    })?;
    if refs.is_empty() {
        return Ok(Resolved { workflow: out, inputs: Vec::new() });
    }
    let usable = |a: &AssetRecord| a.owner == owner && a.expires_at.is_none_or(|e| e > now);
    let mut found: std::collections::HashMap<&str, Option<AssetRecord>> = std::collections::HashMap::new();
    for id in refs.iter().filter_map(|r| r.as_deref().ok()) {
        if !found.contains_key(id) {
            found.insert(id, meta.get_asset(id).await?.filter(usable));
        }
    }
    let mut inputs: Vec<JobInput> = Vec::new();
    let mut missing: Vec<String> = Vec::new();
    let mut names: Vec<Option<String>> = Vec::with_capacity(refs.len());
    for r in &refs {
        let asset = match r {
            Err(why) => {
                missing.push((*why).into());
                None
            }
            Ok(id) => match found.get(id.as_str()).and_then(Option::as_ref) {
                Some(asset) => Some(asset),
                None => {
                    missing.push(id.clone());
                    None
                }
            },
        };
        names.push(asset.map(|asset| {
            let name = input_name(asset, &inputs);
            if !inputs.iter().any(|i| i.name == name) {
                inputs.push(JobInput { name: name.clone(), hash: asset.hash.clone() });
            }
            name
        }));
    }
    if !missing.is_empty() {
        return Err(ServiceError::MissingAsset(missing));
    }
    let mut names = names.into_iter().flatten();
    walk(&mut out, &mut |value| {
        if let Some(name) = names.next() {
            *value = Json::String(name);
        }
        Ok(())
    })?;
    Ok(Resolved { workflow: out, inputs })
}

/// Calls `f` on every asset reference in `value`, depth first.
fn walk(value: &mut Json, f: &mut dyn FnMut(&mut Json) -> Result<(), ServiceError>) -> Result<(), ServiceError> {
    match value {
        Json::Object(map) if map.get("__type").and_then(Json::as_str) == Some(ASSET_TYPE) => f(value),
        Json::Object(map) => map.values_mut().try_for_each(|v| walk(v, f)),
        Json::Array(items) => items.iter_mut().try_for_each(|v| walk(v, f)),
        _ => Ok(()),
    }
}

/// The name an asset is read under: its file name, made unique in the job.
fn input_name(asset: &AssetRecord, taken: &[JobInput]) -> String {
    let base = asset
        .file_path
        .as_deref()
        .and_then(|p| p.rsplit(['/', '\\']).next())
        .filter(|n| !n.is_empty() && *n != "." && *n != ".." && !n.contains('\0'))
        .unwrap_or("input.bin")
        .to_string();
    match taken.iter().find(|i| i.name == base) {
        Some(i) if i.hash != asset.hash => format!("{}-{base}", asset.id),
        _ => base,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::store::SledMeta;

    fn asset(meta: &SledMeta, id: &str, owner: &str, file: &str, byte: u8) -> AssetRecord {
        let a = AssetRecord {
            id: id.into(),
            owner: owner.into(),
            hash: crate::store::blob_name(&blake3::hash(&[byte])),
            size_bytes: 1,
            content_type: "image/png".into(),
            file_path: Some(file.into()),
            created_at: 0,
            expires_at: None,
            job_id: None,
            node_id: None,
            tags: Vec::new(),
        };
        crate::store::wait(meta.put_asset(&a)).unwrap();
        a
    }

    fn reference(id: &str) -> Json {
        json!({ "__type": ASSET_TYPE, "info": { "id": id } })
    }

    #[tokio::test]
    async fn references_resolve_wherever_they_sit() {
        let dir = tempfile::tempdir().unwrap();
        let meta = SledMeta::open(dir.path()).unwrap();
        let a = asset(&meta, "a1", "me", "in/cat.png", 1);
        // Another file called cat.png: same name, other bytes.
        let b = asset(&meta, "b2", "me", "cat.png", 2);
        asset(&meta, "c3", "someone-else", "x.png", 3);
        let workflow = json!({
            "1": { "class_type": "LoadImage", "inputs": { "image": reference("a1") } },
            "2": { "class_type": "Custom", "inputs": { "list": [1, { "deep": [reference("b2"), reference("a1")] }] } },
            "3": { "class_type": "Custom", "inputs": { "map": { "k": { "kk": reference("a1") } } }, "_meta": { "note": reference("b2") } },
        });
        let resolved = resolve_assets(workflow.clone(), &meta, "me", 0).await.unwrap();
        let w = &resolved.workflow;
        assert_eq!(w["1"]["inputs"]["image"], "cat.png");
        assert_eq!(w["2"]["inputs"]["list"][1]["deep"][0], "b2-cat.png", "same name, other bytes: made unique");
        assert_eq!(w["2"]["inputs"]["list"][1]["deep"][1], "cat.png");
        assert_eq!(w["3"]["inputs"]["map"]["k"]["kk"], "cat.png");
        assert_eq!(w["3"]["_meta"]["note"], "b2-cat.png");
        assert_eq!(w["2"]["inputs"]["list"][0], 1, "other values untouched");
        let inputs: Vec<(&str, &str)> = resolved.inputs.iter().map(|i| (i.name.as_str(), i.hash.as_str())).collect();
        assert_eq!(inputs, [("cat.png", a.hash.as_str()), ("b2-cat.png", b.hash.as_str())]);

        // Unknown, foreign and id-less references are all reported, however deep.
        let bad = json!({
            "1": { "class_type": "Custom", "inputs": { "x": [[reference("nope")]], "y": { "z": reference("c3") } } },
            "2": { "class_type": "Custom", "inputs": { "w": { "__type": ASSET_TYPE, "info": { "hash": a.hash } } } },
        });
        match resolve_assets(bad.clone(), &meta, "me", 0).await {
            Err(ServiceError::MissingAsset(mut missing)) => {
                missing.sort();
                assert_eq!(missing, ["(reference without id)", "c3", "nope"]);
            }
            other => panic!("{:?}", other.map(|r| r.workflow)),
        }
    }
}
