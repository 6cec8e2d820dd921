use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::plugins::NodeRegistry;
use crate::test_support::{registry as host, runtime};
use crate::workflow::WorkflowLimits;

fn png() -> Arc<[u8]> {
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, 2, 2);
    encoder.set_color(png::ColorType::Rgb);
    encoder.write_header().unwrap().write_image_data(&[10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120]).unwrap();
    Arc::from(bytes)
}

fn workflow() -> serde_json::Value {
    json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "photo.png"}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "out"}}
    })
}

fn options(include: Include) -> PackOptions {
    PackOptions { name: "invert".into(), version: "1.0.0".into(), include, fixed: BTreeSet::new() }
}

fn packed(include: Include) -> Bundle {
    let inputs = BTreeMap::from([("photo.png".to_string(), png())]);
    pack(host(), &[("main".into(), workflow())], &inputs, &options(include), &WorkflowLimits::default()).unwrap()
}

#[test]
fn a_packed_bundle_reads_back_whole_and_its_bytes_are_reproducible() {
    let bundle = packed(Include::Installed);
    let d = bundle.descriptor();
    assert_eq!(d.workflows.keys().collect::<Vec<_>>(), ["main"]);
    assert!(d.inputs["photo.png"].overridable);
    let core = d.components.iter().find(|c| c.plugin == "core-image").expect("core-image is pinned");
    assert!(!core.included, "bundled plugins are referenced by default");
    assert_eq!(core.classes, ["ImageInvert", "LoadImage", "SaveImage"]);
    let bytes = bundle.to_bytes().unwrap();
    assert_eq!(bytes, packed(Include::Installed).to_bytes().unwrap(), "the same contents make the same bytes");
    let back = Bundle::read(&bytes, 1 << 30).unwrap();
    assert_eq!(back.hash(), bundle.hash());
    assert_eq!(back.descriptor(), d);
    assert_eq!(back.workflow(None, &WorkflowLimits::default()).unwrap(), ("main".to_string(), workflow()));
    assert_eq!(back.input("photo.png").as_deref(), Some(&png()[..]));
    assert!(matches!(back.workflow(Some("other"), &WorkflowLimits::default()), Err(BundleError::NoWorkflow(_))));

    let all = packed(Include::All);
    assert!(all.descriptor().components.iter().all(|c| c.included));
    assert_ne!(all.hash(), bundle.hash(), "what it carries is part of its hash");
}

/// The bundle's files, with `change` applied, as an archive.
fn rewritten(bundle: &Bundle, change: impl FnOnce(&mut BTreeMap<String, Arc<[u8]>>)) -> Vec<u8> {
    let mut files = bundle.files.clone();
    change(&mut files);
    let mut all: Vec<(String, &[u8])> = vec![(DESCRIPTOR.to_string(), &bundle.descriptor_bytes)];
    all.extend(files.iter().map(|(p, b)| (p.clone(), &b[..])));
    archive::write(&all).unwrap()
}

#[test]
fn an_altered_extra_or_missing_file_is_refused_by_name() {
    let bundle = packed(Include::Installed);
    let altered = rewritten(&bundle, |f| {
        f.insert("inputs/photo.png".into(), Arc::from(&b"another picture"[..]));
    });
    match Bundle::read(&altered, 1 << 30) {
        Err(e @ BundleError::HashMismatch { .. }) => assert!(e.to_string().contains("inputs/photo.png"), "{e}"),
        other => panic!("{:?}", other.map(|b| b.hash())),
    }
    let extra = rewritten(&bundle, |f| {
        f.insert("plugins/evil/component.wasm".into(), Arc::from(&b"\0asm"[..]));
    });
    assert!(matches!(Bundle::read(&extra, 1 << 30), Err(BundleError::Malformed(m)) if m.contains("plugins/evil/component.wasm")));
    let missing = rewritten(&bundle, |f| {
        f.remove("workflows/main.json");
    });
    assert!(matches!(Bundle::read(&missing, 1 << 30), Err(BundleError::Malformed(m)) if m.contains("workflows/main.json")));
    let bytes = bundle.to_bytes().unwrap();
    assert!(matches!(Bundle::read(&bytes, 1000), Err(BundleError::TooLarge { limit: 1000 })));
}

#[test]
fn a_descriptor_out_of_bounds_is_refused() {
    let bundle = packed(Include::Installed);
    let mut d = bundle.descriptor().clone();
    d.name = "../escape".into();
    assert!(matches!(Bundle::new(d, bundle.files.clone()), Err(BundleError::Descriptor(m)) if m.contains("name")));
    let mut d = bundle.descriptor().clone();
    d.format = 2;
    assert!(matches!(Bundle::new(d, bundle.files.clone()), Err(BundleError::Descriptor(m)) if m.contains("format 2")));
    let mut d = bundle.descriptor().clone();
    d.components[0].component = "blake3:nothex".into();
    assert!(matches!(Bundle::new(d, bundle.files.clone()), Err(BundleError::Descriptor(_))));
    // Hashes are written in lowercase; an uppercase one would never match.
    let mut d = bundle.descriptor().clone();
    d.components[0].component = d.components[0].component.to_uppercase().replace("BLAKE3:", "blake3:");
    assert!(matches!(Bundle::new(d, bundle.files.clone()), Err(BundleError::Descriptor(m)) if m.contains("lowercase")));
}

#[test]
fn packing_refuses_unread_badly_named_and_unknown_fixed_inputs_and_invalid_workflows() {
    let limits = WorkflowLimits::default();
    let wf = [("main".to_string(), workflow())];
    let two = BTreeMap::from([("photo.png".to_string(), png()), ("spare.png".to_string(), png())]);
    let err = pack(host(), &wf, &two, &options(Include::Installed), &limits).unwrap_err();
    assert!(err.to_string().contains("`spare.png` is not read"), "{err}");
    let bad = BTreeMap::from([("../photo.png".to_string(), png())]);
    assert!(pack(host(), &wf, &bad, &options(Include::Installed), &limits).unwrap_err().to_string().contains("input name"));
    let one = BTreeMap::from([("photo.png".to_string(), png())]);
    let fixed = PackOptions { fixed: BTreeSet::from(["nope.png".to_string()]), ..options(Include::Installed) };
    assert!(pack(host(), &wf, &one, &fixed, &limits).unwrap_err().to_string().contains("--fixed nope.png"));
    // The input it reads is not given.
    assert!(matches!(pack(host(), &wf, &BTreeMap::new(), &options(Include::Installed), &limits), Err(PackError::Invalid { .. })));
    let unknown = [("main".to_string(), json!({"1": {"class_type": "NoSuchNode", "inputs": {}}}))];
    assert!(matches!(pack(host(), &unknown, &BTreeMap::new(), &options(Include::Installed), &limits), Err(PackError::Invalid { .. })));
}

#[tokio::test]
async fn components_resolve_to_the_hosts_own_or_the_bundles_copy_or_are_named_missing() {
    // On this host: the host's own core-image serves it.
    let referenced = packed(Include::None);
    let registry = super::registry(&referenced, host(), runtime()).await.unwrap();
    assert_eq!(registry.bundle(), Some(&referenced.hash()));
    let (plugin, _) = registry.get("ImageInvert").unwrap();
    assert!(Arc::ptr_eq(plugin, host().get("ImageInvert").unwrap().0), "the host's loaded plugin, reused");
    assert!(registry.get("EmptyImage").is_some(), "the whole component, not only the classes used");
    assert!(registry.get("PrimitiveInt").is_none(), "only the bundle's components");

    // On a host without it: named.
    let empty = NodeRegistry::new();
    match super::registry(&referenced, &empty, runtime()).await {
        Err(e @ BundleError::Missing(_)) => {
            let core = referenced.descriptor().components.iter().find(|c| c.plugin == "core-image").unwrap();
            assert!(e.to_string().contains(&format!("core-image {} ({})", core.version, core.component)), "{e}");
        }
        other => panic!("{}", other.err().map(|e| e.to_string()).unwrap_or_default()),
    }
    assert_eq!(missing_components(&referenced, &empty).len(), 1);

    // Carried in the bundle: loaded from its copy, under the bundle's identity.
    let carried = packed(Include::All);
    assert!(missing_components(&carried, &empty).is_empty());
    let registry = super::registry(&carried, &empty, runtime()).await.unwrap();
    let (plugin, _) = registry.get("LoadImage").unwrap();
    assert_eq!(plugin.id, crate::plugins::PluginId::InBundle { bundle: Box::new(carried.hash()), plugin: "core-image".into() });
    assert_eq!(plugin.component_hash, host().get("LoadImage").unwrap().0.component_hash);
}
