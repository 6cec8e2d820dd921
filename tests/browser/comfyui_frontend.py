"""The official ComfyUI web frontend on kiln, in headless Chromium.

Usage: comfyui_frontend.py BASE_URL WORKFLOW_JSON ARTIFACT_DIR [KEY]

Driven by host/tests/serve.rs against a real `kiln serve --front-end-root`.
Playwright (pinned by .ci/run) drives Debian's Chromium (CHROMIUM, default
/usr/bin/chromium); it never downloads a browser. The browser can reach
nothing but loopback: host names resolve to nothing, and every proxied
request goes to a dead proxy this script runs and counts (the test fails if
any request reaches it; requests the page's CSP blocks never leave).

Checks, in order: the UI loads with no error status from kiln other than
the 404s the frontend expects; a UI-format workflow file is opened; an image is uploaded through
LoadImage's upload button; the Run button queues it; the queue panel shows
it finished; the SaveImage node shows the output, which equals pixel for
pixel (at its natural size) what GET /api/view serves and is the inverse of
the uploaded image; the node library lists the core nodes by category.
With KEY (a cloud or serverless server, or a self-hosted token): the UI
first sends the browser to kiln's sign-in page, the key is typed into its
form, and the session cookie (HttpOnly, SameSite=Strict) then carries every
request and the WebSocket; at the end a request from another origin with
that cookie is refused, the same one from the page is not, and signing out
through the page ends the session on the server (the old cookie, replayed,
gets 401).
Writes ARTIFACT_DIR/final.png (the output on SaveImage), queue.png and
node-library.png (screenshots).
"""

import os
import socket
import struct
import sys
import threading
import time
import zlib

from playwright.sync_api import sync_playwright

BASE, WORKFLOW, ARTIFACTS = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
KEY = sys.argv[4] if len(sys.argv) > 4 else None
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
DEADLINE = time.monotonic() + 150
# A loopback port nothing listens on (the discard port).
DEAD = "http://127.0.0.1:9"

# 404s the frontend asks for and handles (compat-protocol.md section 7.2).
EXPECTED_404 = (
    "/user.css",
    "/api/userdata/user.css",
    "/api/userdata?dir=",
    "/api/userdata/comfy.templates.json",
    "/templates/index.json",
    "/templates/index_logo.json",
)


def step(name):
    print(f"[{time.monotonic() - START:5.1f}s] {name}", flush=True)


def wait(page, predicate, what, timeout=30):
    """Polls a JS function (page.wait_for_function would eval a string, which the CSP forbids)."""
    end = min(time.monotonic() + timeout, DEADLINE)
    while time.monotonic() < end:
        value = page.evaluate(predicate)
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def png(width, height):
    """An RGB PNG with a gradient (no imaging library needed)."""
    rows = b"".join(b"\x00" + bytes(v for x in range(width) for v in ((x * 4) % 256, (y * 5) % 256, (x + y * 3) % 256)) for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


class DeadProxy:
    """Accepts connections on loopback, records the request line, answers 502."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.requests = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(2)
                try:
                    line = conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
                except OSError:
                    line = "?"
                self.requests.append(line)
                try:
                    conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass


START = time.monotonic()
os.makedirs(ARTIFACTS, exist_ok=True)
input_png = os.path.join(ARTIFACTS, "kiln-ui-input.png")
with open(input_png, "wb") as f:
    f.write(png(64, 48))
proxy = DeadProxy()
bad_statuses, csp_blocked = [], []

with sync_playwright() as pw:
    browser = pw.chromium.launch(
        executable_path=CHROMIUM,
        args=[
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
            f"--proxy-server=http://127.0.0.1:{proxy.port}",
            "--proxy-bypass-list=127.0.0.1",
            # Chromium's own background calls (network time, preconnects to
            # the search engine, autofill, sign-in, GCM, component updates) would reach
            # the proxy too: turn them off, and point Google's service URLs
            # at a closed loopback port.
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-domain-reliability",
            "--no-pings",
            "--no-first-run",
            "--dns-prefetch-disable",
            "--disable-features=NetworkTimeServiceQuerying,PreconnectToSearch,NetworkPrediction,AutofillServerCommunication,"
            "OptimizationHints,OptimizationHintsFetching,OptimizationGuideModelDownloading,OptimizationTargetPrediction",
            # Component and extension updates (Debian's Chromium 156 asks
            # update.googleapis.com even with component updates disabled).
            f"--component-updater=url-source={DEAD}/update",
            *(f"--{flag}={DEAD}" for flag in ("google-base-url", "gaia-url", "google-apis-url", "lso-url", "gcm-mcs-endpoint")),
            f"--gcm-checkin-url={DEAD}/checkin",
            f"--gcm-registration-url={DEAD}/register",
        ],
    )
    page = browser.new_page(viewport={"width": 1400, "height": 900})

    def on_response(resp):
        url = resp.url
        if resp.status >= 400 and url.startswith(BASE):
            path = url[len(BASE):]
            if not (resp.status == 404 and path.startswith(EXPECTED_404)):
                bad_statuses.append(f"{resp.status} {resp.request.method} {path}")

    page.on("response", on_response)
    page.on("console", lambda m: "Content Security Policy" in m.text and csp_blocked.append(m.text[:200]))
    page.on("pageerror", lambda e: print("page error:", str(e)[:300], flush=True))

    if KEY:
        step("sign in")
        page.goto(BASE + "/")
        assert page.url == BASE + "/login", f"not sent to the sign-in page: {page.url}"
        page.fill("input[name=key]", "kiln_wrong_key")
        with page.expect_navigation():
            page.get_by_role("button", name="Sign in").click()
        assert "not accepted" in page.content(), "a wrong key was not refused on the page"
        bad_statuses.clear()  # that 401 was the point
        page.fill("input[name=key]", KEY)
        with page.expect_navigation():
            page.get_by_role("button", name="Sign in").click()
        assert page.url == BASE + "/", f"signing in led to {page.url}"
        cookie = next(c for c in page.context.cookies() if c["name"] == "kiln_session")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict", cookie
        assert page.evaluate("() => document.cookie.includes('kiln_session')") is False, "the page's scripts can read the session"

    step("load the UI")
    if not KEY:
        page.goto(BASE + "/")
    wait(page, "() => !!(window.app && window.app.graph && window.app.vueAppReady && window.LiteGraph)", "the app")
    count = page.evaluate("() => Object.keys(LiteGraph.registered_node_types).length")
    assert count >= 30, f"only {count} node types registered"

    step("open the UI-format workflow")
    page.set_input_files("#comfy-file-input", WORKFLOW)
    wait(page, "() => app.graph.nodes.map(n => n.type).sort().join() === 'ImageInvert,LoadImage,SaveImage'", "the workflow's nodes")

    step("upload an image through LoadImage's upload button")
    # The button is drawn on the canvas: click it where LiteGraph drew it
    # (once the canvas has laid the node out).
    wait(page, "() => { const n = app.graph.nodes.find(n => n.type === 'LoadImage'); return n.widgets.every(w => w.last_y > 0); }", "the canvas drawn")
    time.sleep(0.5)
    x, y = page.evaluate(
        """() => {
        const node = app.graph.nodes.find(n => n.type === 'LoadImage');
        const w = node.widgets.find(w => w.type === 'button' || w.name === 'upload');
        const ds = app.canvas.ds;
        const [cx, cy] = ds.convertOffsetToCanvas([node.pos[0] + node.size[0] / 2, node.pos[1] + w.last_y + 10]);
        const r = app.canvas.canvas.getBoundingClientRect();
        return [r.left + cx / (window.devicePixelRatio || 1), r.top + cy / (window.devicePixelRatio || 1)];
    }"""
    )
    # A dialog (the first run's templates) may cover the canvas: close it.
    for _ in range(20):
        if not page.evaluate("() => !!document.querySelector('.p-dialog-mask, [role=dialog]')"):
            break
        page.keyboard.press("Escape")
        time.sleep(0.2)
    chooser = None
    for _ in range(10):
        try:
            with page.expect_file_chooser(timeout=2_000) as opened:
                page.mouse.move(x, y)
                page.mouse.down()
                time.sleep(0.05)
                page.mouse.up()
            chooser = opened.value
            break
        except Exception:  # the canvas may still be settling: press again
            pass
    assert chooser is not None, "the upload button opened no file chooser"
    with page.expect_response(lambda r: "/upload/image" in r.url, timeout=30_000) as upload:
        chooser.set_files(input_png)
    assert upload.value.status == 200, f"upload answered {upload.value.status}"
    uploaded = upload.value.json()["name"]
    wait(page, f"() => app.graph.nodes.find(n => n.type === 'LoadImage').widgets[0].value === {uploaded!r}", "the uploaded image selected")

    step("queue with the Run button")
    with page.expect_response(lambda r: r.url.endswith("/api/prompt") and r.request.method == "POST", timeout=30_000) as queued:
        page.get_by_role("button", name="Run", exact=True).click()
    assert queued.value.status == 200, f"POST /api/prompt answered {queued.value.status}: {queued.value.text()}"
    prompt_id = queued.value.json()["prompt_id"]

    step("the output appears on SaveImage")
    src = wait(
        page,
        """() => { const n = app.graph.nodes.find(n => n.type === 'SaveImage');
                   const img = n && n.imgs && n.imgs[0];
                   return img && img.complete && img.naturalWidth > 0 ? img.src : null; }""",
        "the output image on SaveImage",
    )
    assert "/api/view?" in src and "type=output" in src, src
    path = os.path.join(ARTIFACTS, "final.png")
    page.screenshot(path=path)
    print(f"screenshot: {path}", flush=True)

    step("the queue panel shows it finished")
    output_name = page.evaluate("(src) => new URL(src).searchParams.get('filename')", src)
    # A finished job is listed under its output's name (a running one under
    # its progress); "0 active" says nothing is left running.
    for _ in range(10):
        page.get_by_role("button", name="Expand job queue").click()
        try:
            page.get_by_text("Job Queue", exact=True).wait_for(timeout=2_000)
            break
        except Exception:  # the toggle raced a re-render: press again
            pass
    page.get_by_text(output_name, exact=True).first.wait_for(timeout=30_000)
    page.get_by_text("0 active", exact=False).first.wait_for(timeout=30_000)
    page.screenshot(path=os.path.join(ARTIFACTS, "queue.png"))
    history = page.evaluate(f"() => fetch('/api/jobs/{prompt_id}').then(r => r.json())")
    assert history.get("status") == "completed", history

    step("compare pixels")
    result = page.evaluate(
        """async (inputName) => {
        const pixels = async (img) => {
            const c = document.createElement('canvas');
            c.width = img.naturalWidth || img.width; c.height = img.naturalHeight || img.height;
            const ctx = c.getContext('2d');
            ctx.drawImage(img, 0, 0);
            return [c.width, c.height, Array.from(ctx.getImageData(0, 0, c.width, c.height).data)];
        };
        const load = (url) => new Promise((ok, err) => { const i = new Image(); i.onload = () => ok(i); i.onerror = err; i.src = url; });
        const shown = app.graph.nodes.find(n => n.type === 'SaveImage').imgs[0];
        const url = new URL(shown.src);
        url.searchParams.delete('rand');
        const served = await load(URL.createObjectURL(await (await fetch(url)).blob()));
        const input = await load('/api/view?type=input&filename=' + encodeURIComponent(inputName));
        return { shown: await pixels(shown), served: await pixels(served), input: await pixels(input) };
    }""",
        uploaded,
    )
    shown, served, given = result["shown"], result["served"], result["input"]
    assert shown[:2] == served[:2] == [64, 48], (shown[:2], served[:2])
    assert shown[2] == served[2], "the image on SaveImage differs from GET /api/view's"
    # The node computes in floats: 255 - v, give or take a rounding.
    off = [i for i, (v, w) in enumerate(zip(given[2], served[2])) if abs((v if i % 4 == 3 else 255 - v) - w) > 1]
    assert given[:2] == [64, 48] and not off, f"the output is not the input inverted ({len(off)} values off, first at {off[:1]})"


    step("node library")
    page.get_by_role("button", name="Node Library (n)").click()
    for category in ["image", "mask", "utils"]:
        page.get_by_text(category, exact=True).first.wait_for(timeout=30_000)
    page.get_by_text("image", exact=True).first.click()
    for node in ["Load Image", "Invert Image", "Save Image"]:
        page.get_by_text(node, exact=True).first.wait_for(timeout=30_000)
    page.screenshot(path=os.path.join(ARTIFACTS, "node-library.png"))

    if KEY:
        step("the session and another origin; sign out")
        forged = page.request.post(BASE + "/api/interrupt", headers={"Origin": "http://evil.example"})
        assert forged.status == 403, f"a cross-origin request with the cookie answered {forged.status}"
        own = page.evaluate("() => fetch('/api/interrupt', { method: 'POST' }).then(r => r.status)")
        assert own == 200, f"the page's own request answered {own}"
        page.goto(BASE + "/login")
        with page.expect_navigation():
            page.get_by_role("button", name="Sign out").click()
        assert page.url == BASE + "/login", page.url
        assert not [c for c in page.context.cookies() if c["name"] == "kiln_session"], "the cookie stayed"
        replayed = page.request.get(BASE + "/api/queue", headers={"Cookie": f"kiln_session={cookie['value']}"})
        assert replayed.status == 401, f"the ended session still opens /api/queue ({replayed.status})"
        page.goto(BASE + "/")
        assert page.url == BASE + "/login", f"signed out, the UI still opened: {page.url}"
        # (The refusals above were asked for.)
        bad_statuses = [s for s in bad_statuses if s not in ("403 POST /api/interrupt", "401 GET /api/queue")]
    browser.close()

assert not bad_statuses, f"error statuses from kiln: {bad_statuses}"
assert not proxy.requests, f"requests reached the dead proxy: {proxy.requests}"
print(f"CSP blocked {len(csp_blocked)} request(s)/element(s): {csp_blocked}", flush=True)
print(f"OK in {time.monotonic() - START:.1f}s", flush=True)
