"""What kiln's cluster design choices cost against the alternatives, measured
on the database and the bucket themselves (no kiln process runs).

Usage: KILN_BENCH_PG=postgres://user@host:port/db [KILN_BENCH_S3=http://host:port
       AWS_ACCESS_KEY_ID=… AWS_SECRET_ACCESS_KEY=…] python3 host/benches/cluster_choices.py [PART…]
       (PART: leases claims notices jobs billed uploads; all by default,
       uploads only with KILN_BENCH_S3)

Each part uses a fresh database of the server KILN_BENCH_PG names, with
kiln's schema (the migrations under host/src/store/postgres/migrations,
applied in order), and pgbench from the same PostgreSQL.

1. Lease renewal. A host holding N unfinished jobs (rows of kiln's `jobs`
   table with a 1.5 KiB record, as kiln writes them) renews its lease: kiln's
   one `UPDATE hosts` row, against a per-job lease (`locked_until` on every
   row the host holds, renewed by one `UPDATE jobs … WHERE holder = …`).
   Prints the mean time and the WAL bytes of one renewal.
2. Claiming from one table queue. 20 000 queued rows; C concurrent clients
   each claim the oldest queued job (`FOR UPDATE SKIP LOCKED LIMIT 1`, then
   mark it running), for 10 s: claims/s and mean latency.
3. NOTIFY. Notices of 160 bytes on `kiln_events` with one session
   listening: one per transaction, and 32 per statement (kiln's sender
   batches up to 256): notices/s.
4. A job's database work, replayed. One pgbench script is one job as a
   host does it (statements per BENCHMARKS.md "Statements per job"): the
   submission's transaction (the key's advisory lock, the admission read,
   the row of 1.5 KiB inserted), the start's (the row rewritten), the end's
   (the row rewritten, its output asset inserted, the owner's finished
   counter bumped), three NOTIFY batches of five notices, and one read of
   the record; C clients for 10 s: jobs/s the database carries, with
   nothing else on its cores but pgbench.
5. (with KILN_BENCH_S3) Writing a blob only if absent. 8 MiB objects in an
   S3 bucket through curl's SigV4: a PUT of new bytes against the HEAD that
   finds them stored (what "only if absent" answers a duplicate with):
   median ms of each.
6. A billed job's work, replayed on a server whose commits are durable
   (run it against one with fsync on: with fsync off nothing waits for a
   flush). As 4, with the billing of migration 0018: the submission also
   takes the billed account's advisory lock and counts its unfinished
   jobs; the end locks the job row, charges the account's row and announces
   the account's change on `kiln_accounts`. The announcement is sent inside
   the end's transaction, after its commit, or not at all; jobs billed to
   one account or spread over 50; 16 clients for 10 s: jobs/s. A NOTIFY
   makes its transaction's commit take PostgreSQL's one lock on the
   notification queue, held through the commit's flush.

Figures: BENCHMARKS.md ("What the cluster's design choices cost").
"""
import glob, os, statistics, subprocess, sys, tempfile, time, uuid

PG = os.environ.get("KILN_BENCH_PG")
S3 = os.environ.get("KILN_BENCH_S3")
HERE = os.path.dirname(os.path.abspath(__file__))
MIGRATIONS = sorted(glob.glob(os.path.join(HERE, "..", "src", "store", "postgres", "migrations", "*.sql")))


def psql(url, sql):
    return subprocess.run(["psql", "-qAt", "-v", "ON_ERROR_STOP=1", url, "-c", sql], check=True, capture_output=True, text=True).stdout.strip()


def fresh_db():
    name = "kiln_choices_" + uuid.uuid4().hex[:12]
    psql(PG, f"CREATE DATABASE {name}")
    base = PG.rsplit("/", 1)[0]
    url = f"{base}/{name}"
    for path in MIGRATIONS:
        subprocess.run(["psql", "-qAt", "-v", "ON_ERROR_STOP=1", url, "-f", path], check=True, capture_output=True, text=True)
    return name, url


def drop_db(name):
    psql(PG, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def wal(url):
    return int(psql(url, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


def pgbench(url, script, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    try:
        out = subprocess.run(["pgbench", "-n", "-f", f.name, *args, url], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    tps = float(next(l for l in out.splitlines() if l.startswith("tps")).split("=")[1].split()[0])
    latency = float(next(l for l in out.splitlines() if l.startswith("latency average")).split("=")[1].split()[0])
    return tps, latency


def fill_jobs(url, n, status, holder):
    # A record of 1.5 KiB that does not compress away (kept inline, as most are).
    psql(url, f"""INSERT INTO jobs (id, owner, created_at, seq, status, expires_at, record, holder, sched_key)
        SELECT 'j' || g, 'owner' || (g % 50), g, g, '{status}', 9e15::bigint,
               (SELECT string_agg(md5(g::text || r::text), '') FROM generate_series(1, 48) r)::bytea,
               {holder}, 'owner' || (g % 50)
        FROM generate_series(1, {n}) g""")
    psql(url, "ANALYZE jobs")


def leases():
    print("Lease renewal (one host holding N unfinished jobs; 200 renewals each)")
    print(f"{'N jobs':>8} {'per host: ms':>13} {'WAL B':>8} {'per job: ms':>12} {'WAL B':>9}")
    for n in (1, 16, 128, 1024):
        name, url = fresh_db()
        try:
            psql(url, "INSERT INTO hosts (holder, host_id, started_at, lease_until) VALUES ('h/1', 'h', 0, 0)")
            psql(url, "ALTER TABLE jobs ADD COLUMN locked_until BIGINT")
            fill_jobs(url, n, "running", "'h/1'")
            row = []
            for sql in ("UPDATE hosts SET lease_until = lease_until + 1 WHERE holder = 'h/1';",
                        "UPDATE jobs SET locked_until = coalesce(locked_until, 0) + 1 WHERE holder = 'h/1' AND status IN ('queued', 'running', 'canceling');"):
                psql(url, "CHECKPOINT")
                before = wal(url)
                _, latency = pgbench(url, sql, "-c", "1", "-t", "200")
                row += [latency, (wal(url) - before) / 200]
            print(f"{n:>8} {row[0]:>13.3f} {row[1]:>8.0f} {row[2]:>12.3f} {row[3]:>9.0f}")
        finally:
            drop_db(name)


def claims():
    print("Claiming from one table queue (20 000 queued; 10 s per row)")
    print(f"{'clients':>8} {'claims/s':>9} {'mean ms':>8}")
    claim = ("WITH c AS (SELECT id FROM jobs WHERE status = 'queued' ORDER BY created_at, id FOR UPDATE SKIP LOCKED LIMIT 1) "
             "UPDATE jobs j SET status = 'running', holder = 'h/' || :client_id FROM c WHERE j.id = c.id;")
    for clients in (1, 4, 16):
        name, url = fresh_db()
        try:
            fill_jobs(url, 20000, "queued", "NULL")
            tps, latency = pgbench(url, claim, "-c", str(clients), "-j", "2", "-T", "10")
            print(f"{clients:>8} {tps:>9.0f} {latency:>8.2f}")
        finally:
            drop_db(name)


def notices():
    print("NOTIFY (160-byte payloads on kiln_events, one session listening; 10 s per row)")
    print(f"{'per statement':>14} {'clients':>8} {'notices/s':>10}")
    name, url = fresh_db()
    listener = subprocess.Popen(["psql", "-qAt", url, "-c", "LISTEN kiln_events", "-c", "SELECT pg_sleep(120)"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        for batch, clients in ((1, 1), (1, 8), (32, 1), (32, 8)):
            sql = f"SELECT pg_notify('kiln_events', repeat('x', 160)) FROM generate_series(1, {batch});"
            tps, _ = pgbench(url, sql, "-c", str(clients), "-j", "2", "-T", "10")
            print(f"{batch:>14} {clients:>8} {tps * batch:>10.0f}")
    finally:
        listener.kill()
        listener.wait()
        drop_db(name)


JOB = """\\set n random(1, 9000000000000)
BEGIN;
SELECT pg_advisory_xact_lock(hashtext('kiln: admit jobs of owner' || (:n % 50)));
SELECT count(*) FROM (SELECT 1 FROM jobs WHERE sched_key = 'owner' || (:n % 50) AND status = 'queued' LIMIT 100) w;
INSERT INTO jobs (id, owner, created_at, seq, status, expires_at, record, holder, sched_key)
  VALUES ('job' || :n, 'owner' || (:n % 50), :n, :n, 'queued', 9000000000000000, convert_to(repeat(md5(:n::text), 48), 'UTF8'), 'h/1', 'owner' || (:n % 50));
COMMIT;
BEGIN;
UPDATE jobs SET status = 'running', record = convert_to(repeat(md5(:n::text || 'r'), 48), 'UTF8') WHERE id = 'job' || :n AND holder = 'h/1';
COMMIT;
BEGIN;
UPDATE jobs SET status = 'succeeded', holder = NULL, record = convert_to(repeat(md5(:n::text || 's'), 50), 'UTF8') WHERE id = 'job' || :n AND holder = 'h/1';
INSERT INTO assets (id, hash, job_id, expires_at, tags, record) VALUES ('asset' || :n, md5(:n::text), 'job' || :n, 9000000000000000, '{}', convert_to(repeat(md5(:n::text), 10), 'UTF8'));
INSERT INTO finished_changes (owner, n) VALUES ('owner' || (:n % 50), 1) ON CONFLICT (owner) DO UPDATE SET n = finished_changes.n + 1;
COMMIT;
SELECT pg_notify('kiln_events', repeat('x', 160)) FROM generate_series(1, 5);
SELECT pg_notify('kiln_events', repeat('x', 160)) FROM generate_series(1, 5);
SELECT pg_notify('kiln_events', repeat('x', 160)) FROM generate_series(1, 5);
SELECT record FROM jobs WHERE id = 'job' || :n;
"""


def jobs():
    print("A job's database work, replayed (10 s per row)")
    print(f"{'clients':>8} {'jobs/s':>7} {'mean ms':>8} {'WAL B/job':>10}")
    for clients in (4, 16):
        name, url = fresh_db()
        listener = subprocess.Popen(["psql", "-qAt", url, "-c", "LISTEN kiln_events", "-c", "SELECT pg_sleep(120)"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            before = wal(url)
            tps, latency = pgbench(url, JOB, "-c", str(clients), "-j", "2", "-T", "10")
            done = int(psql(url, "SELECT count(*) FROM jobs"))
            print(f"{clients:>8} {tps:>7.0f} {latency:>8.2f} {(wal(url) - before) / max(done, 1):>10.0f}")
        finally:
            listener.kill()
            listener.wait()
            drop_db(name)


BILLED_JOB = """\\set n random(1, 9000000000000)
\\set a :n % {accounts}
BEGIN;
SELECT pg_advisory_xact_lock(hashtext('kiln: admit jobs of acct' || :a));
SELECT pg_advisory_xact_lock(hashtext('kiln: bill acct' || :a));
SELECT a.credits, a.disabled,
  (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE billed = 'acct' || :a AND status IN ('queued', 'running', 'canceling')
   LIMIT (SELECT greatest(credits / 3, 0) + 1 FROM accounts WHERE id = 'acct' || :a)) b),
  (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE sched_key = 'acct' || :a AND status = 'queued' LIMIT 100) w)
  FROM (SELECT 1) one LEFT JOIN accounts a ON a.id = 'acct' || :a;
INSERT INTO jobs (id, owner, created_at, seq, status, expires_at, record, holder, sched_key, billed)
  VALUES ('job' || :n, 'acct' || :a, :n, :n, 'queued', 9000000000000000, convert_to(repeat(md5(:n::text), 48), 'UTF8'), 'h/1', 'acct' || :a, 'acct' || :a);
COMMIT;
BEGIN;
UPDATE jobs SET status = 'running', record = convert_to(repeat(md5(:n::text || 'r'), 48), 'UTF8') WHERE id = 'job' || :n AND holder = 'h/1';
COMMIT;
BEGIN;
SELECT status IN ('queued', 'running', 'canceling'), billed FROM jobs WHERE id = 'job' || :n FOR UPDATE;
UPDATE jobs SET status = 'succeeded', holder = NULL, record = convert_to(repeat(md5(:n::text || 's'), 50), 'UTF8') WHERE id = 'job' || :n;
INSERT INTO assets (id, hash, job_id, expires_at, tags, record) VALUES ('asset' || :n, md5(:n::text), 'job' || :n, 9000000000000000, '{{}}', convert_to(repeat(md5(:n::text), 10), 'UTF8'));
INSERT INTO finished_changes (owner, n) VALUES ('acct' || :a, 1) ON CONFLICT (owner) DO UPDATE SET n = finished_changes.n + 1;
UPDATE accounts SET credits = credits - 3 WHERE id = 'acct' || :a
  AND credits::numeric - 3 BETWEEN -9223372036854775808 AND 9223372036854775807 RETURNING id, name, key_hashes, credits, tier, subscription_active, disabled, created_at;
{inside}
COMMIT;
{after}
SELECT pg_notify('kiln_events', repeat('x', 160)) FROM generate_series(1, 5);
SELECT pg_notify('kiln_events', repeat('x', 160)) FROM generate_series(1, 5);
SELECT pg_notify('kiln_events', repeat('x', 160)) FROM generate_series(1, 5);
SELECT record FROM jobs WHERE id = 'job' || :n;
"""


def billed():
    print(f"A billed job's database work, replayed (16 clients, 10 s per row; fsync {psql(PG, 'SHOW fsync')})")
    print(f"{'accounts':>9} {'announced':>10} {'jobs/s':>7} {'mean ms':>8}")
    announce = "SELECT pg_notify('kiln_accounts', 'h/1' || chr(10) || 'acct' || :a);"
    for accounts in (50, 1):
        for where in ("inside", "after", "never"):
            name, url = fresh_db()
            listener = subprocess.Popen(["psql", "-qAt", url, "-c", "LISTEN kiln_events", "-c", "LISTEN kiln_accounts", "-c", "SELECT pg_sleep(120)"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                psql(url, f"""INSERT INTO accounts (id, name, key_hashes, credits, tier, subscription_active, disabled, created_at)
                    SELECT 'acct' || g, 'acct' || g, '{{}}', 9000000000000000, 'free', false, false, 0 FROM generate_series(0, {accounts - 1}) g""")
                time.sleep(0.5)
                script = BILLED_JOB.format(accounts=accounts, inside=announce if where == "inside" else "", after=announce if where == "after" else "")
                tps, latency = pgbench(url, script, "-c", "16", "-j", "2", "-T", "10")
                print(f"{accounts:>9} {where:>10} {tps:>7.0f} {latency:>8.2f}")
            finally:
                listener.kill()
                listener.wait()
                drop_db(name)


def curl_s3(method, key, body=None):
    cmd = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{time_total}", "-X", method,
           "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{os.environ['AWS_ACCESS_KEY_ID']}:{os.environ['AWS_SECRET_ACCESS_KEY']}",
           # (curl signs no payload hash; S3 takes this header instead.)
           "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]
    if method == "HEAD":
        cmd.append("-I")
    if body:
        cmd += ["--data-binary", f"@{body}"]
    out = subprocess.run(cmd + [f"{S3}/{key}"], check=True, capture_output=True, text=True).stdout.split()
    return int(out[0]), float(out[1]) * 1000


def uploads():
    bucket = "kiln-choices-" + uuid.uuid4().hex[:8]
    code, _ = curl_s3("PUT", bucket)
    assert code == 200, f"cannot create bucket {bucket}: {code}"
    print("Writing an 8 MiB blob: PUT of new bytes against the HEAD that finds them (20 each)")
    puts, heads = [], []
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(os.urandom(8 << 20))
    try:
        for i in range(20):
            code, ms = curl_s3("PUT", f"{bucket}/blobs/{i}", f.name)
            assert code == 200, code
            puts.append(ms)
            code, ms = curl_s3("HEAD", f"{bucket}/blobs/{i}")
            assert code == 200, code
            heads.append(ms)
        print(f"PUT p50 {statistics.median(puts):.1f} ms, HEAD p50 {statistics.median(heads):.1f} ms")
        for i in range(20):
            curl_s3("DELETE", f"{bucket}/blobs/{i}")
        curl_s3("DELETE", bucket)
    finally:
        os.unlink(f.name)


if __name__ == "__main__":
    if not PG:
        sys.exit("KILN_BENCH_PG must name a PostgreSQL server whose user may create databases")
    print(psql(PG, "SELECT version()").split(",")[0], "| fsync", psql(PG, "SHOW fsync"), "| synchronous_commit", psql(PG, "SHOW synchronous_commit"))
    parts = {"leases": leases, "claims": claims, "notices": notices, "jobs": jobs, "billed": billed, "uploads": uploads}
    for part in sys.argv[1:] or [p for p in parts if p != "uploads" or S3]:
        parts[part]()
