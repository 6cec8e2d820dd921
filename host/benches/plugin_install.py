"""Install-to-first-run latency of a plugin in a running server.

Usage: python3 host/benches/plugin_install.py KILN V1.wasm V2.wasm [ROUNDS]

Starts the release binary on a fresh data directory with an operator token,
then, ROUNDS times (default 10), installs the example plugin (alternately
the two components, both defining ExamplePosterize) through
`POST /admin/plugins` and runs a job with its node (EmptyImage 64x64 ->
ExamplePosterize -> SaveImage) until it succeeds. Prints, per round, the
install's answer time, the job's submit-to-succeeded time and their sum;
the first round of each component compiles it, later rounds load the
compiled artifact from the plugin cache. Figures: BENCHMARKS.md.
"""
import json, os, statistics, subprocess, sys, tempfile, time, urllib.request, uuid

TOKEN = "bench-operator-token"


def request(method, url, body=None, headers=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req) as resp:
        return json.load(resp)


def install(base, manifest, wasm):
    boundary = uuid.uuid4().hex
    parts = [
        (b'Content-Disposition: form-data; name="manifest"\r\n\r\n', manifest.encode()),
        (b'Content-Disposition: form-data; name="component"; filename="plugin.wasm"\r\nContent-Type: application/wasm\r\n\r\n', wasm),
    ]
    body = b"".join(b"--" + boundary.encode() + b"\r\n" + head + data + b"\r\n" for head, data in parts) + b"--" + boundary.encode() + b"--\r\n"
    headers = {"content-type": "multipart/form-data; boundary=" + boundary, "authorization": "Bearer " + TOKEN}
    return request("POST", base + "/admin/plugins", body, headers)


def run_job(base):
    wf = {"1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0x4080c0}},
          "2": {"class_type": "ExamplePosterize", "inputs": {"image": ["1", 0], "levels": 3}},
          "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "b"}}}
    job = request("POST", base + "/api/v2/jobs", json.dumps({"workflow": wf}).encode(), {"content-type": "application/json"})
    while job["status"] not in ("succeeded", "failed", "canceled"):
        time.sleep(0.002)
        job = request("GET", base + "/api/v2/jobs/" + job["id"])
    assert job["status"] == "succeeded", job
    return job


def main():
    binary, v1, v2 = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    components = [open(v1, "rb").read(), open(v2, "rb").read()]
    data = tempfile.mkdtemp()
    env = dict(os.environ, KILN_ADMIN_TOKEN=TOKEN, KILN_RESULT_CACHE_MB="0")
    p = subprocess.Popen([binary, "serve", "--port", "0", "--data-dir", data], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        base = p.stdout.readline().decode().strip().split("listening on ")[1]
        rows = []
        for i in range(rounds):
            manifest = 'name = "example-posterize"\nversion = "1.0.%d"\ncomponent = "plugin.wasm"\n' % i
            t0 = time.perf_counter()
            info = install(base, manifest, components[i % 2])
            t1 = time.perf_counter()
            job = run_job(base)
            t2 = time.perf_counter()
            assert job["components"]["example-posterize"] == info["hash"], (job, info)
            rows.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t2 - t0) * 1e3))
            print("round %d (%s): install %.1f ms, first job %.1f ms, total %.1f ms" % (i + 1, "compiles" if i < 2 else "cached", *rows[-1]))
        cached = rows[2:]
        if cached:
            print("cached rounds, median: install %.1f ms, first job %.1f ms, total %.1f ms"
                  % tuple(statistics.median(r[k] for r in cached) for k in range(3)))
    finally:
        p.terminate()
        p.wait()


if __name__ == "__main__":
    main()
