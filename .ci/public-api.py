"""The `kiln` crate's public surface, one line per item, from rustdoc's JSON.

Usage: python3 .ci/public-api.py TARGET/doc/kiln.json > host/public-api.txt
(the JSON from `RUSTC_BOOTSTRAP=1 cargo rustdoc -p kiln --lib -- -Z
unstable-options --output-format json --document-hidden-items`, built in a
target folder of its own: RUSTC_BOOTSTRAP is part of cargo's fingerprints)

Walks the crate from its root through public modules and re-exports,
skipping what is marked `#[doc(hidden)]` (the host's internals; hidden items
are in the JSON only so that re-exports of them resolve), listing each item with its kind, struct fields, enum variants,
and the inherent methods and trait impls of types, with parameter names. CI
compares the listing with the committed `host/public-api.txt`, so the
surface changes only on purpose: regenerate the file with the command
above and commit it with the change.
"""
import json, sys

doc = json.load(open(sys.argv[1]))
index = doc["index"]
out = set()


def item(i):
    return index.get(str(i))


def kind_of(it):
    return next(iter(it["inner"]))


def params(fn):
    sig = fn["sig"]
    names = [name for name, _ in sig["inputs"]]
    return "(" + ", ".join(names) + ")" + (" -> _" if sig.get("output") else "")


def trait_name(t):
    return t["path"] if t else "?"


def describe(it, path):
    kind = kind_of(it)
    inner = it["inner"][kind]
    name = "::".join(path)
    if kind == "function":
        out.add(f"fn {name}{params(inner)}")
        return
    out.add(f"{kind} {name}")
    if kind == "struct":
        fields = inner["kind"].get("plain", {}).get("fields", []) if isinstance(inner["kind"], dict) else []
        for f in fields:
            fi = item(f)
            if fi and fi["visibility"] == "public":
                out.add(f"field {name}.{fi['name']}")
    if kind == "enum":
        for v in inner["variants"]:
            out.add(f"variant {name}::{item(v)['name']}")
    for i in inner.get("impls", []):
        imp = item(i)
        if not imp:
            continue
        imp = imp["inner"]["impl"]
        if imp.get("is_synthetic") or imp.get("blanket_impl") is not None:
            continue
        if imp.get("trait") is None:
            for m in imp["items"]:
                mi = item(m)
                if mi and mi["visibility"] == "public" and kind_of(mi) == "function" and not hidden(mi):
                    out.add(f"fn {name}::{mi['name']}{params(mi['inner']['function'])}")
        else:
            out.add(f"impl {trait_name(imp['trait'])} for {name}")


def hidden(it):
    return any("doc(hidden)" in str(a) for a in it.get("attrs", []))


def walk(i, path):
    it = item(i)
    if it is None or (it["visibility"] != "public" and path) or hidden(it):
        return
    kind = kind_of(it)
    if kind == "module":
        for child in it["inner"]["module"]["items"]:
            walk(child, path + ([it["name"]] if path else ["kiln"]))
    elif kind == "use":
        use = it["inner"]["use"]
        target = item(use["id"]) if use.get("id") is not None else None
        if target is not None and not use.get("is_glob"):
            describe(target, path + [use["name"]])
        else:
            out.add(f"use {'::'.join(path)}::{use['name']} = {use['source']}")
    else:
        describe(it, path + [it["name"]])


walk(doc["root"], [])
print("\n".join(sorted(out)))
