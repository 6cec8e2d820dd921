//! The compatibility WebSocket.
