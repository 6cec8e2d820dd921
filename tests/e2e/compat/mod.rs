//! The ComfyUI compatibility API (`/api`, bare paths, `/ws`) over real HTTP
//! and WebSocket connections on loopback, checked against the reference
//! captures in `tests/fixtures/comfyui/captures/`.

mod frontend;
mod http;
mod ws;
mod ws_input;
