// Drives kiln with the unmodified npm client `@stable-canvas/comfyui-client`:
// uploads an image (the library's fetchApi, as its examples do), queues a
// workflow with `enqueue` (which waits on the WebSocket), records the
// WebSocket events it saw, and downloads the output through the URL the
// library builds (`/view`). Prints one JSON line for the Rust test to check.
//
// usage: node comfyui_client_e2e.mjs HOST:PORT INPUT.png
import { readFileSync } from "node:fs";
import { Client } from "@stable-canvas/comfyui-client";
import WebSocket from "ws";

const [host, input] = process.argv.slice(2);
const client = new Client({ api_host: host, WebSocket, fetch, clientId: "kiln-node-e2e" });
const seen = [];
for (const type of ["status", "execution_start", "execution_cached", "executing", "progress", "executed", "execution_success", "execution_error"]) {
  client.on(type, (data) => seen.push({ type, prompt_id: data?.prompt_id ?? null }));
}
const deadline = setTimeout(() => {
  console.error("timed out");
  process.exit(3);
}, 60_000);

try {
  await client.getSystemStats();
  await client.connect({ websocket: { enabled: true }, timeout_ms: 10_000 });

  const form = new FormData();
  form.append("image", new Blob([readFileSync(input)], { type: "image/png" }), "node-client.png");
  form.append("type", "input");
  form.append("overwrite", "true");
  const uploaded = await (await client.fetchApi("/upload/image", { method: "POST", body: form })).json();

  const output = await client.enqueue(
    {
      "1": { class_type: "LoadImage", inputs: { image: uploaded.name } },
      "2": { class_type: "ImageInvert", inputs: { image: ["1", 0] } },
      "3": { class_type: "SaveImage", inputs: { images: ["2", 0], filename_prefix: "node-client" } },
    },
    { disable_random_seed: true },
  );
  const url = output.images[0].data;
  const response = await fetch(url);
  const bytes = Buffer.from(await response.arrayBuffer());
  console.log(JSON.stringify({ uploaded, prompt_id: output.prompt_id, url, status: response.status, output_b64: bytes.toString("base64"), events: seen }));
} finally {
  clearTimeout(deadline);
  client.close();
}
