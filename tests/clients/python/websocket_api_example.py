"""A ComfyUI client written the way ComfyUI's own `websocket_api_example.py`
works (urllib + the `websocket-client` package), driven against kiln by the
e2e suite (host/tests/clients.rs): open /ws with a client id, upload an image,
queue a prompt on /prompt, read messages until `executing` with a null node
for that prompt, then read /history/{id} and download each output via /view.

Prints one JSON line for the Rust test to check.

usage: python websocket_api_example.py HOST:PORT INPUT.png
"""

import base64
import json
import sys
import urllib.parse
import urllib.request
import uuid

import websocket  # websocket-client

server, image_path = sys.argv[1], sys.argv[2]
client_id = str(uuid.uuid4())


def queue_prompt(prompt):
    data = json.dumps({"prompt": prompt, "client_id": client_id}).encode("utf-8")
    req = urllib.request.Request(f"http://{server}/prompt", data=data, headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())


def upload_image(path):
    boundary = uuid.uuid4().hex
    with open(path, "rb") as f:
        content = f.read()
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"py-client.png\"\r\n"
        "Content-Type: image/png\r\n\r\n"
    ).encode() + content + f"\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"overwrite\"\r\n\r\ntrue\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(f"http://{server}/upload/image", data=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    return json.loads(urllib.request.urlopen(req).read())


def get_image(filename, subfolder, folder_type):
    query = urllib.parse.urlencode({"filename": filename, "subfolder": subfolder, "type": folder_type})
    with urllib.request.urlopen(f"http://{server}/view?{query}") as response:
        return response.read()


def get_history(prompt_id):
    with urllib.request.urlopen(f"http://{server}/history/{prompt_id}") as response:
        return json.loads(response.read())


ws = websocket.WebSocket()
ws.settimeout(60)
ws.connect(f"ws://{server}/ws?clientId={client_id}")
uploaded = upload_image(image_path)
prompt = {
    "1": {"class_type": "LoadImage", "inputs": {"image": uploaded["name"]}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "py-client"}},
}
prompt_id = queue_prompt(prompt)["prompt_id"]
messages = []
while True:
    out = ws.recv()
    if not isinstance(out, str):
        continue  # binary previews
    message = json.loads(out)
    data = message.get("data", {})
    if data.get("prompt_id") == prompt_id:
        messages.append(message["type"])
    if message["type"] == "executing" and data.get("node") is None and data.get("prompt_id") == prompt_id:
        break
ws.close()

history = get_history(prompt_id)[prompt_id]
images = []
for node_id, node_output in history["outputs"].items():
    for image in node_output.get("images", []):
        images.append(base64.b64encode(get_image(image["filename"], image["subfolder"], image["type"])).decode())
print(json.dumps({"prompt_id": prompt_id, "uploaded": uploaded, "messages": messages, "status": history["status"], "images": images}))
