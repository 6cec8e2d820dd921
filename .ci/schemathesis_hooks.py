"""Seed data for schemathesis (.ci/contract): explicit examples, in the
examples phase, that use the asset .ci/contract uploaded (KILN_SEED_ASSET,
its Asset JSON): a job that loads it (LoadImage, then SaveImage), labelled
`seed=contract` so the script can check it ran, and reads of the asset.
Generated cases and the stateful phase's links are left as schemathesis
makes them, but for one filter: a listing's `metadata` filters (deepObject,
`metadata[key]=value`) are sent only with text values (see filter_query)."""

import json
import os

import schemathesis

SEED = json.loads(os.environ["KILN_SEED_ASSET"])


@schemathesis.hook
def before_add_examples(context, examples):
    operation = context.operation
    if operation is None:
        return
    label = f"{operation.method.upper()} {operation.path}"
    if label == "POST /jobs":
        image = {"__type": "core/ASSET", "info": {k: SEED[k] for k in ("id", "hash", "file_path")}}
        workflow = {
            "1": {"class_type": "LoadImage", "inputs": {"image": image}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "seed"}},
        }
        body = {"workflow": workflow, "metadata": {"seed": "contract"}}
        examples.append(operation.Case(body=body, media_type="application/json"))
    elif label in ("GET /assets/{id}", "GET /assets/{id}/content"):
        examples.append(operation.Case(path_parameters={"id": SEED["id"]}))


@schemathesis.hook
def filter_query(context, query):
    # A query string holds only text: a label filter whose value is not a
    # string either reads as one (5 as "5") or sends nothing (null, [], {}:
    # dropped), so a schema-violating {"bad key": null} would reach the
    # server as no filter at all, which it rightly answers 200. Filters with
    # text values, and `metadata` of any other type, are sent.
    metadata = (query or {}).get("metadata")
    return not (isinstance(metadata, dict) and not all(isinstance(v, str) for v in metadata.values()))
