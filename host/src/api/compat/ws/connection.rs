//! One WebSocket connection: a reader of the client's frames and the bus,
//! and a writer task behind a bounded buffer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use super::render::{self, Frame};
use super::{SOCKET_BUFFER_BYTES, SOCKET_BUFFER_FRAMES};
use crate::api::AppState;
use crate::service::bus::ExecMessage;

/// How long a closing connection may take to write what it has left.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// The connection's outgoing buffer: bounded in frames (the channel's
/// capacity) and bytes (`waiting_bytes`, which the writer decrements).
struct Outbox {
    tx: mpsc::Sender<Message>,
    waiting_bytes: Arc<AtomicUsize>,
    max_bytes: usize,
}

impl Outbox {
    /// An outbox of `frames` and `max_bytes`, and the receiving end.
    fn new(frames: usize, max_bytes: usize) -> (Outbox, mpsc::Receiver<Message>) {
        let (tx, rx) = mpsc::channel(frames);
        (Outbox { tx, waiting_bytes: Arc::new(AtomicUsize::new(0)), max_bytes }, rx)
    }

    /// Queues `frame`; `false` when the buffer is full (the client fell behind).
    fn push(&self, frame: Frame) -> bool {
        self.push_message(into_message(frame))
    }

    /// Queues a frame already made (shared with other connections: a
    /// clone shares its bytes).
    fn push_message(&self, message: Message) -> bool {
        let len = message_len(&message);
        if self.waiting_bytes.fetch_add(len, Ordering::SeqCst) + len > self.max_bytes {
            return false;
        }
        self.tx.try_send(message).is_ok()
    }
}

fn into_message(frame: Frame) -> Message {
    match frame {
        Frame::Text(t) => Message::Text(t.into()),
        Frame::Binary(b) => Message::Binary(b.into()),
    }
}

fn message_len(message: &Message) -> usize {
    match message {
        Message::Text(t) => t.len(),
        Message::Binary(b) => b.len(),
        _ => 0,
    }
}

/// The frame of a bus message for connections that asked for preview
/// metadata or not: rendered by the first connection to send it, shared by
/// the rest (an account's every socket gets every message of its jobs).
fn frame_of(message: &ExecMessage, preview_metadata: bool) -> Option<Message> {
    message.rendered.get_or_make(usize::from(preview_metadata), || render::message(message, preview_metadata).map(into_message)).flatten()
}

/// Whether a connection of `owner` sees `message`.
fn visible(message: &ExecMessage, owner: &str) -> bool {
    message.owner.as_deref().is_none_or(|o| o == owner)
}

/// Serves one connection until the client leaves, falls behind, the server
/// closes, or its account is disabled (`slot`'s signal; the slot counts the
/// connection among the owner's streams while it lives).
pub async fn run(socket: WebSocket, state: Arc<AppState>, owner: Arc<str>, sid: String, slot: crate::service::StreamGuard) {
    let ended = slot.closed();
    let (mut sink, mut incoming) = socket.split();
    // Subscribed before the queue is counted: no change falls in between.
    let mut bus = state.service.bus().subscribe();
    // Other hosts running the owner's jobs send their previews here meanwhile.
    let _watching = state.service.bus().watch_owner(&owner);
    let (outbox, mut rx) = Outbox::new(SOCKET_BUFFER_FRAMES, SOCKET_BUFFER_BYTES);
    let waiting_bytes = outbox.waiting_bytes.clone();
    let mut writer = tokio::spawn(async move {
        while let Some(message) = rx.recv().await {
            let len = message_len(&message);
            if sink.send(message).await.is_err() {
                return;
            }
            waiting_bytes.fetch_sub(len, Ordering::SeqCst);
        }
        let _ = sink.close().await;
    });
    state.service.touch();
    outbox.push(render::status(state.service.queue_remaining_everywhere(&owner).await, Some(&sid)));
    // A client that (re)connects while a job runs hears which node runs
    // (ComfyUI's reconnect variant: no `prompt_id`).
    for (_, node) in state.service.running_nodes(&owner) {
        outbox.push(render::reconnect_executing(&node));
    }
    let mut read_first_text = false;
    let mut preview_metadata = false;
    let fell_behind = loop {
        tokio::select! {
            _ = state.closing.cancelled() => break false,
            _ = ended.cancelled() => break false,
            frame = incoming.next() => match frame {
                // Only the first text frame is looked at: a `feature_flags`
                // message is answered with the server's.
                Some(Ok(Message::Text(text))) if !read_first_text => {
                    read_first_text = true;
                    if let Ok(value) = serde_json::from_str::<serde_json::Value>(&text)
                        && value["type"] == "feature_flags"
                    {
                        preview_metadata = value["data"]["supports_preview_metadata"] == true;
                        if !outbox.push(render::feature_flags(super::server_features(&state))) {
                            break true;
                        }
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break false,
                Some(Ok(_)) => {}
            },
            received = bus.recv() => match received {
                Ok(message) => {
                    if visible(&message, &owner)
                        && let Some(frame) = frame_of(&message, preview_metadata)
                        && !outbox.push_message(frame)
                    {
                        break true;
                    }
                }
                Err(RecvError::Lagged(_)) => break true,
                Err(RecvError::Closed) => break false,
            },
        }
    };
    drop(outbox);
    if fell_behind {
        // Never waited for: the connection is dropped with what it had queued.
        tracing::debug!(sid = %sid, "a WebSocket client fell behind: disconnected");
        writer.abort();
        return;
    }
    if tokio::time::timeout(CLOSE_GRACE, &mut writer).await.is_err() {
        writer.abort();
    }
    drop(slot);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outbox_refuses_frames_past_its_bounds() {
        let (outbox, mut rx) = Outbox::new(2, 1 << 20);
        assert!(outbox.push(Frame::Text("a".into())));
        assert!(outbox.push(Frame::Binary(vec![1, 2])));
        assert!(!outbox.push(Frame::Text("c".into())), "two frames at most");
        assert!(rx.try_recv().is_ok());
        let (outbox, _rx) = Outbox::new(16, 10);
        assert!(outbox.push(Frame::Text("12345678".into())));
        assert!(!outbox.push(Frame::Text("123".into())), "ten bytes at most");
    }

    #[test]
    fn a_message_is_rendered_once_for_every_connection() {
        use crate::service::bus::ExecBody;
        let message = ExecMessage::new(Arc::from("j"), None, ExecBody::Succeeded { at_ms: 1 });
        let text = |m: Option<Message>| match m {
            Some(Message::Text(t)) => t,
            other => panic!("{other:?}"),
        };
        let (first, second) = (text(frame_of(&message, false)), text(frame_of(&message, false)));
        assert!(first.contains("execution_success"));
        assert_eq!(first.as_str().as_ptr(), second.as_str().as_ptr(), "the second connection shares the first one's bytes");
        // Connections that asked for preview metadata get their own rendering.
        assert_eq!(text(frame_of(&message, true)), first);
    }

    #[test]
    fn a_connection_sees_its_owners_jobs_and_the_queue() {
        use crate::service::bus::ExecBody;
        let message = |owner: Option<&str>| ExecMessage::new(Arc::from("j"), owner.map(Arc::from), ExecBody::Queue { remaining: 0 });
        assert!(visible(&message(Some("me")), "me"));
        assert!(!visible(&message(Some("other")), "me"));
        assert!(visible(&message(None), "me"));
    }
}
