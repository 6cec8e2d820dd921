"""ComfyUI listings over a long history: /api/jobs and /history with an offset.

Usage: python3 host/benches/compat_listing.py OLD_KILN NEW_KILN

Starts each release binary on a fresh data directory (result cache off),
queues 1000 small EmptyImage -> SaveImage prompts through /api/prompt, waits
for them, then for 5 s each requests `/api/jobs?limit=20&offset=40` and
`/history?max_items=20&offset=100` one after another from one client and
prints requests/s; two rounds, the builds alternating. Figures: BENCHMARKS.md.

With KILN_BENCH_PG (a postgres:// URL of a server whose user may create
databases) each run keeps its records in a fresh database there
(`store = "postgres"`), and whole-window `/history` is timed too.
"""
import json, os, subprocess, sys, tempfile, threading, time, urllib.request, uuid
PG = os.environ.get("KILN_BENCH_PG")
def run(binary):
    data = tempfile.mkdtemp()
    env = dict(os.environ, KILN_RESULT_CACHE_MB="0")
    if PG:
        name = "kiln_bench_" + uuid.uuid4().hex
        subprocess.run(["psql", "-q", PG, "-c", "CREATE DATABASE " + name], check=True)
        env.update(KILN_STORE="postgres", KILN_DATABASE_URL=PG.rsplit("/", 1)[0] + "/" + name)
    p = subprocess.Popen([binary, "serve", "--port", "0", "--data-dir", data], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    base = p.stdout.readline().decode().strip().split("listening on ")[1]
    wf = {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 1}},
          "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "l"}}}
    ids = []
    for i in range(1000):
        wf["1"]["inputs"]["color"] = i
        req = urllib.request.Request(base + "/api/prompt", data=json.dumps({"prompt": wf}).encode(), headers={"content-type": "application/json"})
        ids.append(json.load(urllib.request.urlopen(req))["prompt_id"])
    while json.load(urllib.request.urlopen(base + "/api/queue"))["queue_pending"] or json.load(urllib.request.urlopen(base + "/api/queue"))["queue_running"]:
        time.sleep(0.2)
    out = {}
    paths = ["/api/jobs?limit=20&offset=40", "/history?max_items=20&offset=100"] + (["/history?max_items=64", "/history"] if PG else [])
    for path in paths:
        urllib.request.urlopen(base + path).read()
        n, t0 = 0, time.time()
        while time.time() - t0 < 5:
            urllib.request.urlopen(base + path).read(); n += 1
        out[path] = n / (time.time() - t0)
    p.kill(); p.wait()
    return out
for rnd in range(2):
    for name, binary in (("old", sys.argv[1]), ("new", sys.argv[2])):
        print(rnd, name, {k: round(v, 1) for k, v in run(binary).items()}, flush=True)
