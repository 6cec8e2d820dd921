"""How long `kiln migrate --to postgres` takes to copy an embedded data directory.

Usage: KILN_BENCH_PG=postgres://user@host:port/db [KILN_BENCH_S3=http://host:port] \
       python3 host/benches/migrate.py KILN [JOBS]

KILN is a release binary. An embedded `kiln serve` on a fresh data directory
runs JOBS (default 2000) small EmptyImage -> SaveImage jobs, each with its own
Idempotency-Key and colour (so JOBS jobs, output assets, claims and distinct
blobs), submitted by eight client threads; the server is stopped, and the
directory is copied into a fresh database of the server KILN_BENCH_PG names
(and, with KILN_BENCH_S3, its blobs into a fresh bucket there; credentials
from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY). Then the copy is run again
(nothing left to write: every record and blob checked present). Prints the
wall time of both copies and records per second. Figures: BENCHMARKS.md.
"""
import json, os, subprocess, sys, tempfile, threading, time, urllib.request, uuid

PG = os.environ["KILN_BENCH_PG"]
S3 = os.environ.get("KILN_BENCH_S3")
BIN = sys.argv[1]
JOBS = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
CLIENTS = 8


def post(url, body, key):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json", "idempotency-key": key})
    return json.load(urllib.request.urlopen(req))


def fill(data):
    env = dict(os.environ, KILN_GPU="off", KILN_LOG="warn", KILN_MAX_QUEUED_JOBS="100000", KILN_RESULT_CACHE_MB="0")
    p = subprocess.Popen([BIN, "serve", "--port", "0", "--data-dir", data], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    base = p.stdout.readline().decode().strip().split("listening on ")[1]
    ids = []

    def client(n):
        for i in range(n, JOBS, CLIENTS):
            wf = {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": i}},
                  "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "m"}}}
            ids.append(post(base + "/api/v2/jobs", {"workflow": wf}, "bench-%d" % i)["id"])

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for job_id in ids:
        while json.load(urllib.request.urlopen(base + "/api/v2/jobs/" + job_id))["status"] != "succeeded":
            time.sleep(0.01)
    p.terminate()
    p.wait()


def copy(data, env):
    start = time.monotonic()
    out = subprocess.run([BIN, "migrate", "--to", "postgres", "--from", data], env=env, capture_output=True, text=True)
    took = time.monotonic() - start
    if out.returncode != 0:
        sys.exit("kiln migrate failed:\n" + out.stdout + out.stderr)
    return took, out.stdout


def main():
    data = tempfile.mkdtemp()
    fill(data)
    name = "kiln_bench_" + uuid.uuid4().hex
    subprocess.run(["psql", "-qAt", PG, "-c", "CREATE DATABASE " + name], check=True, capture_output=True)
    env = dict(os.environ, KILN_LOG="warn", KILN_DATABASE_URL=PG.rsplit("/", 1)[0] + "/" + name)
    if S3:
        env.update(KILN_BLOB_STORE="s3", KILN_S3_ENDPOINT=S3, KILN_S3_BUCKET="kiln-bench-" + uuid.uuid4().hex[:12])
    records = 3 * JOBS  # jobs, output assets, claims
    for label in ("first copy", "second copy"):
        took, printed = copy(data, env)
        print("%s: %.2f s, %.0f records/s (+ %d blobs%s)" % (label, took, records / took, JOBS, " to S3" if S3 else ", left in place"))
        print("  " + printed.strip().replace("\n", "\n  "))


main()
