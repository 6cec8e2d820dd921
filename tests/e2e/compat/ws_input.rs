//! What a client sends on the compatibility WebSocket, at random: 96
//! sequences (a fixed seed, so a failure replays) of `feature_flags`
//! messages with odd data, JSON of every shape (nested past the parser's
//! depth limit too), text that is not JSON, binary frames, pings, frames
//! over the 64 KiB bound and closes. The server answers only a first
//! `feature_flags` frame, ends a connection only when the client closes it
//! or sends an oversized frame, and goes on serving everyone else.

use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

use crate::api::start_default;
use crate::support::Rng;

/// What a frame is to the server.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// A `feature_flags` message (answered when it is the first text frame).
    Flags,
    /// Any other text frame.
    Text,
    /// Not text; the connection goes on.
    Other,
    /// The connection ends: a close, or a frame over the bound.
    Ends,
}

/// A frame a client might send, and what it is to the server.
fn frame(rng: &mut Rng) -> (Message, Kind) {
    let oddities = [json!(null), json!(true), json!(-1), json!("x"), json!([1, {}]), json!({ "supports_preview_metadata": "yes" })];
    match rng.below(10) {
        0 | 1 => {
            let data = if rng.below(2) == 0 { json!({ "supports_preview_metadata": rng.below(2) == 0 }) } else { oddities[rng.below(6) as usize].clone() };
            (Message::text(json!({ "type": "feature_flags", "data": data }).to_string()), Kind::Flags)
        }
        2 => (Message::text(json!({ "type": oddities[rng.below(6) as usize].clone(), "data": {} }).to_string()), Kind::Text),
        3 => {
            let depth = 1 + rng.below(20_000) as usize;
            (Message::text(format!("{}{}", "[".repeat(depth), "]".repeat(depth))), Kind::Text)
        }
        4 => {
            let len = rng.below(512) as usize;
            (Message::text(String::from_utf8_lossy(&rng.bytes(len)).into_owned()), Kind::Text)
        }
        5 => {
            let len = rng.below(4096) as usize;
            (Message::binary(rng.bytes(len)), Kind::Other)
        }
        6 => (Message::Ping(rng.bytes(8).into()), Kind::Other),
        7 => (Message::text("x".repeat((64 << 10) + 1 + rng.below(4096) as usize)), Kind::Ends),
        8 => (Message::binary(vec![0u8; (64 << 10) + 1]), Kind::Ends),
        _ => (Message::Close(None), Kind::Ends),
    }
}

#[tokio::test]
async fn any_frames_a_client_sends_end_at_most_its_own_connection() {
    let s = start_default().await;
    let url = format!("{}/ws?clientId=fuzz", s.server.url().replacen("http://", "ws://", 1));
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut ended, mut answered_flags) = (0, 0);
    for sequence in 0..96 {
        let (mut socket, _) = tokio_tungstenite::connect_async(&url).await.expect("the WebSocket opens");
        let mut frames = Vec::new();
        let (mut ends, mut first_text) = (false, None);
        for _ in 0..1 + rng.below(6) {
            let (message, kind) = frame(&mut rng);
            frames.push(format!("{message:?}").chars().take(80).collect::<String>());
            if first_text.is_none() && matches!(kind, Kind::Flags | Kind::Text) {
                first_text = Some(kind);
            }
            ends = kind == Kind::Ends;
            // The server may reset a connection it ends before an
            // oversized frame is all written: an error only then.
            if let Err(e) = socket.send(message).await {
                assert!(ends, "sequence {sequence}: sending {frames:?}: {e}");
            }
            if ends {
                break;
            }
        }
        if ends {
            ended += 1;
            // The server closes (or has closed) this connection, and only it.
            let closed = tokio::time::timeout(std::time::Duration::from_secs(10), async {
                while let Some(Ok(m)) = socket.next().await {
                    if matches!(m, Message::Close(_)) {
                        break;
                    }
                }
            })
            .await;
            assert!(closed.is_ok(), "sequence {sequence}: the connection stayed open after {frames:?}");
        } else {
            // Still open: a ping is answered; a first text frame that was
            // `feature_flags` was answered with the server's, before it.
            socket.send(Message::Ping(b"still there?".to_vec().into())).await.unwrap_or_else(|e| panic!("sequence {sequence} {frames:?}: {e}"));
            let mut flags = false;
            let pong = tokio::time::timeout(std::time::Duration::from_secs(10), async {
                while let Some(m) = socket.next().await {
                    match m {
                        Ok(Message::Pong(p)) if &p[..] == b"still there?" => return true,
                        Ok(Message::Text(t)) => flags |= serde_json::from_str::<serde_json::Value>(&t).is_ok_and(|v| v["type"] == "feature_flags"),
                        Ok(_) => {}
                        Err(_) => return false,
                    }
                }
                false
            })
            .await;
            assert_eq!(pong, Ok(true), "sequence {sequence}: the connection ended after {frames:?}");
            // (The answer goes out through the connection's writer, the pong
            // straight from its reader: either may come first.)
            let expected = first_text == Some(Kind::Flags);
            let linger = std::time::Duration::from_millis(if expected && !flags { 5000 } else { 50 });
            let _ = tokio::time::timeout(linger, async {
                while let Some(Ok(m)) = socket.next().await {
                    if let Message::Text(t) = m {
                        flags |= serde_json::from_str::<serde_json::Value>(&t).is_ok_and(|v| v["type"] == "feature_flags");
                        if flags {
                            return;
                        }
                    }
                }
            })
            .await;
            assert_eq!(flags, first_text == Some(Kind::Flags), "sequence {sequence}: {frames:?}");
            answered_flags += usize::from(flags);
        }
        assert_eq!(s.get("/health").await.0, 200);
    }
    assert!(ended > 10 && ended < 90 && answered_flags > 5, "the sequences cover both ends: {ended} ended, {answered_flags} flags");
}
