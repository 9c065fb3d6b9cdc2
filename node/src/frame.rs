//! Framing: a 4-byte big-endian length, then one prost-encoded `proto::Frame`. Lengths are
//! bounded so a bad or hostile peer costs at most one frame buffer, never unbounded memory.

use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use htc_engine::wire::proto;

/// Largest frame either side accepts. A dispatch of 4096 tasks with 64 KiB commands would not
/// fit, so senders cap batches by bytes as well as count (see `MAX_BATCH_BYTES`).
pub const MAX_FRAME: usize = 16 << 20;
pub use htc_engine::wire::{dispatches, MAX_BATCH_BYTES};
// A full batch plus its frame's other fields must fit in a frame.
const _: () = assert!(2 * MAX_BATCH_BYTES <= MAX_FRAME);

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("frame of {0} bytes exceeds the {1}-byte limit")]
    TooLarge(usize, usize),
    #[error("undecodable frame: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("frame without a body")]
    Empty,
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Largest frame accepted from a peer that has not yet proved it knows the job secret (the
/// handshake and the Hello), so a stranger cannot make us allocate `MAX_FRAME` per connection.
pub const MAX_HELLO: usize = 4096;

/// Reads one frame. `Closed` means a clean end of stream at a frame boundary.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> Result<proto::frame::Body, FrameError> {
    read_frame_limited(r, buf, MAX_FRAME).await
}

/// Reads one frame of at most `limit` bytes.
pub async fn read_frame_limited<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    limit: usize,
) -> Result<proto::frame::Body, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    let limit = limit.min(MAX_FRAME);
    if len > limit {
        return Err(FrameError::TooLarge(len, limit));
    }
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    decode(buf)
}

pub fn decode(buf: &[u8]) -> Result<proto::frame::Body, FrameError> {
    proto::Frame::decode(buf)?.body.ok_or(FrameError::Empty)
}

/// Starts a task that writes whatever frames are queued on the returned sender, coalescing
/// everything queued at that moment into one write; it shuts the socket down when the sender is
/// dropped or a write fails.
pub fn spawn_writer(mut wr: tokio::net::tcp::OwnedWriteHalf) -> tokio::sync::mpsc::UnboundedSender<Vec<u8>> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(mut out) = rx.recv().await {
            while let Ok(more) = rx.try_recv() {
                out.extend_from_slice(&more);
            }
            if wr.write_all(&out).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    tx
}

/// As `spawn_writer`, and when nothing was written for `every`, writes `keepalive`: the leader's
/// heartbeat to a child comes from its network side too, so a leader thread held up by a slow
/// commit or disk sync does not let its agents' leases run out.
pub fn spawn_writer_with_keepalive(
    mut wr: tokio::net::tcp::OwnedWriteHalf,
    every: std::time::Duration,
    keepalive: Vec<u8>,
) -> tokio::sync::mpsc::UnboundedSender<Vec<u8>> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        loop {
            let mut out = match tokio::time::timeout(every, rx.recv()).await {
                Ok(Some(out)) => out,
                Ok(None) => break,
                Err(_) => keepalive.clone(),
            };
            while let Ok(more) = rx.try_recv() {
                out.extend_from_slice(&more);
            }
            if wr.write_all(&out).await.is_err() {
                break;
            }
        }
        let _ = wr.shutdown().await;
    });
    tx
}

/// Socket options for every leader/agent connection: no Nagle delay for small frames, and TCP
/// keepalive so a peer whose node hangs or vanishes without a reset is noticed in about a
/// minute (the connection then fails and the agent counts as lost) instead of never.
pub fn tune(s: &tokio::net::TcpStream) -> std::io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    s.set_nodelay(true)?;
    setsockopt(s, sockopt::KeepAlive, &true)?;
    setsockopt(s, sockopt::TcpKeepIdle, &30)?;
    setsockopt(s, sockopt::TcpKeepInterval, &10)?;
    Ok(setsockopt(s, sockopt::TcpKeepCount, &3)?)
}

/// Appends one encoded frame (length prefix included) to `out`, so callers can coalesce
/// several frames into one write.
pub fn encode_into(body: proto::frame::Body, out: &mut Vec<u8>) {
    let f = proto::Frame { body: Some(body) };
    let len = f.encoded_len();
    debug_assert!(len <= MAX_FRAME);
    out.reserve(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    f.encode(out).expect("Vec grows as needed");
}

pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, body: proto::frame::Body) -> Result<(), FrameError> {
    let mut out = Vec::new();
    encode_into(body, &mut out);
    w.write_all(&out).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::frame::Body;

    #[tokio::test]
    async fn roundtrip_and_limits() {
        let mut out = Vec::new();
        encode_into(Body::Ack(proto::Ack { seq: 7, agent: 0, resync: false }), &mut out);
        encode_into(
            Body::Shutdown(proto::Shutdown { revive: false, abort: true, reason: "x".into(), agent: 0, hold: false }),
            &mut out,
        );
        let mut r = &out[..];
        let mut buf = Vec::new();
        assert!(matches!(read_frame(&mut r, &mut buf).await.unwrap(), Body::Ack(proto::Ack { seq: 7, .. })));
        assert!(matches!(read_frame(&mut r, &mut buf).await.unwrap(), Body::Shutdown(_)));
        assert!(matches!(read_frame(&mut r, &mut buf).await, Err(FrameError::Closed)));

        let huge = ((MAX_FRAME + 1) as u32).to_be_bytes();
        assert!(matches!(read_frame(&mut &huge[..], &mut buf).await, Err(FrameError::TooLarge(..))));
        let garbage = [0, 0, 0, 3, 0xff, 0xff, 0xff];
        assert!(matches!(read_frame(&mut &garbage[..], &mut buf).await, Err(FrameError::Decode(_))));
        let empty = [0, 0, 0, 0];
        assert!(matches!(read_frame(&mut &empty[..], &mut buf).await, Err(FrameError::Empty)));
        let truncated = [0, 0, 0, 9, 1];
        assert!(matches!(read_frame(&mut &truncated[..], &mut buf).await, Err(FrameError::Io(_))));
    }

    #[test]
    fn random_bytes_never_panic_the_decoder() {
        let mut x: u64 = 88172645463325252;
        for n in 0..5000 {
            let mut v = Vec::new();
            for _ in 0..(n % 64) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.push(x as u8);
            }
            let _ = decode(&v);
        }
    }
}
