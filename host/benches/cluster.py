"""Jobs across hosts: one embedded host, then 1, 2 and 3 hosts on one PostgreSQL.

Usage: KILN_BENCH_PG=postgres://user@host:port/db [KILN_BENCH_S3=http://host:port
       AWS_ACCESS_KEY_ID=… AWS_SECRET_ACCESS_KEY=…] python3 host/benches/cluster.py KILN [JOBS]

KILN is a release binary. Each configuration starts its hosts on fresh data
directories (result cache off, GPU off) and, for PostgreSQL, a fresh
database of the server KILN_BENCH_PG names (its user must create
databases). Eight client threads submit JOBS (default 600) small
EmptyImage -> SaveImage jobs through /api/v2/jobs, round-robin over the
hosts (or, in the rows marked "all to one", every job to the first host,
as a load balancer pinning one client would: idle hosts take queued jobs),
each thread polling its job on the next host until it has succeeded. Prints jobs/s, submit -> succeeded p50/p95 and, for PostgreSQL,
the database's transactions, WAL bytes and NOTIFY notices per job (from
pg_stat_database, pg_current_wal_lsn and a listener on kiln_events and
kiln_queues) and, where the server preloads pg_stat_statements, the
statements kiln's hosts ran per job (each at least one round trip; the
bench's own queries left out), and the bytes kiln's hosts sent to and got
from the database (and, with KILN_BENCH_S3, the bucket) per job: the
kernel's byte counts of the hosts' own TCP connections (`ss -ti`), read
before and after the run. With KILN_BENCH_S3 the PostgreSQL rows keep
their blobs in a fresh bucket of that S3 server, as a cluster does;
without it, in each host's files.
Figures: BENCHMARKS.md.
"""
import json, os, subprocess, sys, tempfile, threading, time, urllib.parse, urllib.request, uuid

PG = os.environ.get("KILN_BENCH_PG")
S3 = os.environ.get("KILN_BENCH_S3")
BIN = sys.argv[1]
JOBS = int(sys.argv[2]) if len(sys.argv) > 2 else 600
CLIENTS = 8


def psql(url, sql):
    return subprocess.run(["psql", "-qAt", url, "-c", sql], check=True, capture_output=True, text=True).stdout.strip()


# kiln's statements in the current database (not this script's own).
STATEMENTS = ("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
              "AND query NOT LIKE '%pg_stat%' AND query NOT LIKE '%pg_current_wal_lsn%' AND query NOT LIKE 'LISTEN%' AND query <> 'SELECT $1'")


def statements(db):
    try:
        return int(psql(db, STATEMENTS))
    except subprocess.CalledProcessError:
        return None


def wire(pids, port):
    """Bytes sent and received on the established TCP connections of
    processes `pids` to `port`, by connection."""
    out = subprocess.run(["ss", "-tinpH", "state", "established", "( dport = :%d )" % port], capture_output=True, text=True).stdout
    counts, key = {}, None
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            fields = line.split()
            key = fields[2] if any("pid=%d," % p in line for p in pids) else None
        elif key:
            info = dict(f.split(":", 1) for f in line.split() if f.startswith(("bytes_sent:", "bytes_received:")))
            counts[key] = int(info.get("bytes_sent", 0)) + int(info.get("bytes_received", 0))
    return counts


def moved(before, after):
    return sum(n - before.get(k, 0) for k, n in after.items())


def start(env, name):
    data = tempfile.mkdtemp()
    env = dict(env, KILN_HOST_ID=name)
    p = subprocess.Popen([BIN, "serve", "--port", "0", "--data-dir", data], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    return p, p.stdout.readline().decode().strip().split("listening on ")[1]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req))


def run(hosts, pg, one=False):
    env = dict(os.environ, KILN_RESULT_CACHE_MB="0", KILN_GPU="off", KILN_LOG="warn", KILN_MAX_QUEUED_JOBS="100000")
    db = None
    if pg:
        name = "kiln_bench_" + uuid.uuid4().hex
        psql(PG, "CREATE DATABASE " + name)
        db = PG.rsplit("/", 1)[0] + "/" + name
        try:
            psql(db, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        except subprocess.CalledProcessError:
            pass
        env.update(KILN_STORE="postgres", KILN_DATABASE_URL=db)
        if S3:
            env.update(KILN_BLOB_STORE="s3", KILN_S3_ENDPOINT=S3, KILN_S3_BUCKET="kiln-bench-" + uuid.uuid4().hex[:12])
    procs = [start(env, "bench-%d" % i) for i in range(hosts)]
    pids = [p.pid for p, _ in procs]
    ports = {"db": urllib.parse.urlparse(PG).port or 5432} if db else {}
    if db and S3:
        ports["s3"] = urllib.parse.urlparse(S3).port or 80
    wire_before = {what: wire(pids, port) for what, port in ports.items()}
    bases = [b for _, b in procs]
    notices = []
    listener = None
    if db:
        # Counts the notices the hosts send: psql prints each one it holds
        # after its next command, so it is asked a trivial one every 50 ms.
        listener = subprocess.Popen(["psql", "-qAt", db], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        listener.stdin.write("LISTEN kiln_events;\nLISTEN kiln_queues;\n")
        listener.stdin.flush()

        def hear():
            # A payload is `<sender>\n<json>`: psql prints it over two lines.
            size = None
            for line in listener.stdout:
                if line.startswith("Asynchronous notification"):
                    size = len(line.split(' with payload "', 1)[-1])
                elif size is not None:
                    size += len(line.rsplit('" received from server', 1)[0])
                if size is not None and '" received from server' in line:
                    notices.append(size)
                    size = None

        def ask():
            try:
                while True:
                    listener.stdin.write("SELECT 1;\n")
                    listener.stdin.flush()
                    time.sleep(0.05)
            except (BrokenPipeError, ValueError, OSError):
                pass
        threading.Thread(target=hear, daemon=True).start()
        threading.Thread(target=ask, daemon=True).start()
        before = psql(db, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"), psql(db, "SELECT pg_current_wal_lsn()"), statements(db)
    latencies, lock, counter = [], threading.Lock(), iter(range(JOBS))

    def client(c):
        while True:
            with lock:
                n = next(counter, None)
            if n is None:
                return
            wf = {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": n}},
                  "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "b"}}}
            t0 = time.perf_counter()
            job = post(bases[0 if one else n % hosts] + "/api/v2/jobs", {"workflow": wf})
            poll = bases[(n + 1) % hosts] + "/api/v2/jobs/" + job["id"]
            while job["status"] != "succeeded":
                assert job["status"] in ("queued", "running"), job
                time.sleep(0.002)
                job = json.load(urllib.request.urlopen(poll))
            with lock:
                latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    wall = time.perf_counter() - t0
    extra = ""
    if db:
        time.sleep(0.5)
        xacts = int(psql(db, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()")) - int(before[0])
        wal = int(psql(db, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '%s')" % before[1]).split(".")[0])
        extra = " | %.1f transactions/job | %.0f WAL bytes/job | %.1f notices/job, %.0f bytes each" % (
            xacts / JOBS, wal / JOBS, len(notices) / JOBS, (sum(notices) / len(notices)) if notices else 0)
        after = statements(db)
        if before[2] is not None and after is not None:
            extra += " | %.1f statements/job" % ((after - before[2]) / JOBS)
        for what, port in ports.items():
            extra += " | %.0f %s bytes/job" % (moved(wire_before[what], wire(pids, port)) / JOBS, what)
        listener.kill()
    for p, _ in procs:
        p.terminate()
        p.wait()
    latencies.sort()
    p50, p95 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.95)]
    backend = ("PostgreSQL + S3" if S3 else "PostgreSQL") if pg else "embedded"
    label = "%d host%s, %s%s" % (hosts, "" if hosts == 1 else "s", backend, ", all to one" if one else "")
    print("%-42s %7.1f jobs/s | p50 %6.1f ms | p95 %6.1f ms%s" % (label, JOBS / wall, p50 * 1e3, p95 * 1e3, extra), flush=True)


if __name__ == "__main__":
    run(1, False)
    if PG:
        for hosts in (1, 2, 3):
            run(hosts, True)
        run(3, True, one=True)
