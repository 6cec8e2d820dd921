"""kiln's Jobs API driven by the real `comfy-sdk` (0.5.0) from PyPI.

Run by `host/tests/serve.rs` against a real `kiln serve` on loopback, started
with `--token` and at most one running and two queued jobs. Environment:
COMFY_BASE_URL, KILN_TEST_TOKEN. Exits non-zero on the first failed check.
"""

import os
import threading
import time
import uuid
import zlib
import struct

import blake3
import httpx

from comfy_sdk import Comfy, JobFailed, OutputReady, StatusChange
from comfy_sdk.exceptions import IdempotencyKeyReuse, NotFound, Unauthorized

TOKEN = os.environ["KILN_TEST_TOKEN"]
BASE = os.environ["COMFY_BASE_URL"]


def png(width, height, seed):
    """A small RGB PNG, built by hand so the test needs nothing but the SDK."""
    rows = b"".join(b"\x00" + bytes(((x * 7 + y * 13 + seed) % 256) for x in range(width * 3)) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def record_traffic(client):
    """Logs (method, path, status) of every request the SDK makes."""
    seen = []

    def on_response(response):
        seen.append((response.request.method, response.request.url.path, response.status_code))

    client._low._client.event_hooks = {"request": [], "response": [on_response]}
    return seen


def load_save_workflow(client):
    return client.workflows.from_json({
        "10": {"class_type": "LoadImage", "inputs": {"image": None}},
        "11": {"class_type": "ImageInvert", "inputs": {"image": ["10", 0]}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["11", 0], "filename_prefix": "sdk"}},
    })


def heavy_workflow(client, color):
    """Many seconds of work, so a job is surely still running or queued when
    the test cancels it: a chain of 60 radius-31 blurs of 2048² (the blurs
    run as host kernels, ≈ 0.1–0.2 s each here; two 4096² blurs once took
    seconds and now can finish before the cancel). A cancel stops the chain
    within one band of rows, so the length costs nothing when it is used."""
    graph = {"0": {"class_type": "EmptyImage", "inputs": {"width": 2048, "height": 2048, "batch_size": 1, "color": color}}}
    for i in range(1, 61):
        graph[str(i)] = {"class_type": "ImageBlur", "inputs": {"image": [str(i - 1), 0], "blur_radius": 31, "sigma": 9.0}}
    graph["out"] = {"class_type": "SaveImage", "inputs": {"images": ["60", 0], "filename_prefix": "heavy"}}
    return client.workflows.from_json(graph)


def run_end_to_end(client):
    traffic = record_traffic(client)
    data = png(24, 16, 5)
    image = client.assets.from_bytes(data, filename="photo.png", content_type="image/png")
    wf = load_save_workflow(client)
    wf.set_input("10", "image", image)
    job = client.submit(wf)
    kinds = []
    for event in job.events():
        kinds.append(event)
    statuses = [e.status for e in kinds if isinstance(e, StatusChange)]
    outputs_seen = [i for i, e in enumerate(kinds) if isinstance(e, OutputReady)]
    check(statuses and statuses[-1] == "succeeded", f"stream ended with {statuses}")
    check(outputs_seen and outputs_seen[0] < len(kinds) - 1, f"OutputReady before the terminal status: {kinds}")
    job = job.result()
    check(job.status == "succeeded", job.status)
    outs = job.get_outputs("9")
    check(len(outs) == 1, f"outputs: {job.outputs}")
    out = outs[0]
    body = out.to_bytes()
    digest = "blake3:" + blake3.blake3(body).hexdigest()
    raw = client._low.get_job(job.id)
    wire = [o for o in raw.outputs if o.id == out.id][0]
    check(wire.hash == digest, f"downloaded bytes hash to {digest}, the job says {wire.hash}")
    check(out.size_bytes == len(body), "size_bytes is exact")
    check(body[:8] == b"\x89PNG\r\n\x1a\n", "a PNG came back")
    check(out.to_bytes(range=(0, 3)) == body[:4], "ranged download")
    url = out.get_download_url()
    check(url.url.startswith("http"), f"download url {url}")
    # The executed workflow, without extra data.
    executed = job.get_workflow()
    check(executed.format == "api" and executed.graph["9"]["class_type"] == "SaveImage", f"workflow: {executed}")
    posts = [t for t in traffic if t[0] == "POST" and t[1].endswith("/assets")]
    check(len(posts) == 1, f"one upload: {traffic}")

    # The same bytes again: HEAD 200 + from-hash, and no second upload.
    traffic.clear()
    again = client.assets.from_bytes(data, filename="photo.png", content_type="image/png")
    wf2 = load_save_workflow(client)
    wf2.set_input("10", "image", again)
    job2 = client.run(wf2, timeout=120)
    check(job2.status == "succeeded", job2.status)
    check(any(t[0] == "HEAD" and t[2] == 200 for t in traffic), f"HEAD by-hash hit: {traffic}")
    check(any(t[1].endswith("/assets/from-hash") for t in traffic), f"from-hash: {traffic}")
    check(not any(t[0] == "POST" and t[1].endswith("/assets") for t in traffic), f"no second upload: {traffic}")

    # An output is usable as the next job's input.
    wf3 = load_save_workflow(client)
    wf3.set_input("10", "image", client.assets.get(out.id))
    job3 = client.run(wf3, timeout=120)
    third = job3.outputs[0].to_bytes()
    check(third[:8] == b"\x89PNG\r\n\x1a\n" and third != body, "an output fed back in as an input")

    # The SDK's low-level layer sends tags (one multipart part each, and a
    # JSON array on from-hash); its Asset model reads kiln's answers.
    import io
    tagged_bytes = png(8, 8, 77)
    tagged = client._low.post_assets(io.BytesIO(tagged_bytes), "image/png", "tagged.png", tags=["sdk", "e2e"])
    check(tagged.hash == "blake3:" + blake3.blake3(tagged_bytes).hexdigest(), f"tagged upload: {tagged}")
    wire_tags = client._low.raw_request("GET", f"/assets/{tagged.id}").json()["tags"]
    check(wire_tags == ["sdk", "e2e"], f"tags kept: {wire_tags}")
    minted = client._low.asset_from_hash(tagged.hash, file_path="tagged-copy.png", tags=["copy"])
    check(minted.id != tagged.id and minted.expires_at is None, f"from-hash with tags: {minted}")


def failures_and_errors(client):
    # A node failure is a JobFailed carrying the node.
    bad = client.assets.from_bytes(b"not an image at all", filename="broken.png", content_type="image/png")
    wf = load_save_workflow(client)
    wf.set_input("10", "image", bad)
    try:
        client.run(wf, timeout=60)
        raise AssertionError("a broken image must fail the job")
    except JobFailed as e:
        check(e.error is not None and e.error.node_id == "10", f"JobFailed names the node: {e.error}")

    try:
        client.jobs.get(str(uuid.uuid4()))
        raise AssertionError("unknown job")
    except NotFound:
        pass

    key = "sdk-key-" + uuid.uuid4().hex
    simple = client.workflows.from_json({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 3}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "k"}},
    })
    client.submit(simple, idempotency_key=key)
    try:
        client.submit(simple, idempotency_key=key)
        raise AssertionError("a reused key must be refused")
    except IdempotencyKeyReuse:
        pass

    ids = [s.id for s in client.list_jobs(limit=2)]
    check(len(ids) == len(set(ids)) and len(ids) >= 5, f"list_jobs pages without repeats: {ids}")

    with Comfy() as anonymous:
        try:
            anonymous.jobs.get(str(uuid.uuid4()))
            raise AssertionError("no token must be refused")
        except Unauthorized:
            pass


def cancel_and_queue_full(client):
    # One running job, two queued: the queue (2) is full.
    running = client.submit(heavy_workflow(client, 1))
    queued = [client.submit(heavy_workflow(client, c)) for c in (2, 3)]
    # submit() retries the 429 under one key; cancelling a queued job makes room.
    def make_room():
        time.sleep(1.5)
        queued[0].cancel()

    helper = threading.Thread(target=make_room)
    helper.start()
    started = time.monotonic()
    extra = client.submit(heavy_workflow(client, 4))
    helper.join()
    check(time.monotonic() - started >= 1.0, "submit waited for room")
    state = queued[0].refresh()
    check(state.status == "canceled", f"queued job canceled: {state.status} {state.error} running={running.refresh().status} {running.refresh().error}")
    for job in [running, queued[1], extra]:
        job.cancel()
    for job in [running, queued[1], extra]:
        final = job.wait(timeout=60)
        check(final.status == "canceled", f"{job.id}: {final.status}")
        try:
            final.result()
            raise AssertionError("a canceled job is not a result")
        except JobFailed:
            pass


def main():
    with Comfy(api_key=TOKEN) as client:
        run_end_to_end(client)
        failures_and_errors(client)
        cancel_and_queue_full(client)
    print("sdk e2e: all checks passed")


if __name__ == "__main__":
    main()
