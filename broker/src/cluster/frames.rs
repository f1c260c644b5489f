//! Raft RPCs multiplexed on one long-lived HTTP/2 stream per node pair
//! (`RaftTransport.Frames`, message `RaftFrame`): the small appends and the
//! votes of every group. A unary call opens an HTTP/2 stream each time:
//! request headers, a server task, response headers and trailers, and two
//! socket writes on the sending side. With 10,000 queues that per-call cost
//! was most of what a new queue cost the cluster (issue 31). On the frame
//! stream a call is one message each way, and messages queued together go
//! out in one write.
//!
//! Client side: [`FrameLinks`], one [`Link`] per peer, opened on first use
//! and again after it broke; a call waits for the reply with its id (the
//! caller bounds the wait). Server side: [`reply_channel`] and [`reply`]
//! (`cluster::server` answers each frame on a task of its own, so replies
//! come in any order). A peer that answers UNIMPLEMENTED (an older binary)
//! gets unary calls for [`RETRY_UNSUPPORTED`].

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use quorumq_proto::v1::raft_transport_client::RaftTransportClient;
use quorumq_proto::v1::RaftFrame;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Status;

use super::peers::{Peers, MAX_MESSAGE_BYTES};

/// Frame kind of an AppendEntries (`RaftFrame.kind`).
pub const APPEND: u32 = 1;
/// Frame kind of a Vote.
pub const VOTE: u32 = 2;
/// Frame kind of a meta write forwarded to the meta group's leader
/// (`Cluster.Propose` as a frame: the payload is the command, the reply a
/// `ProposeReply` message). A forwarded queue declare paid ~1 ms for its
/// unary call with 8 channels declaring (issue 31). An older peer answers
/// INVALID_ARGUMENT ("unknown frame kind"): the caller then makes the call.
pub const PROPOSE: u32 = 3;

/// Largest payload sent as a frame (bytes): HTTP/2's default frame size.
/// Frames on a stream arrive in order, so a bigger append (message bodies)
/// goes as a call of its own, interleaved with the frame stream as HTTP/2
/// interleaves streams, rather than hold up other groups' frames behind it
/// (on a slow link, seconds).
pub const MAX_FRAME_PAYLOAD: usize = 16 << 10;

/// How long a peer that answered UNIMPLEMENTED gets unary calls before frames
/// are tried again (it may have been upgraded meanwhile).
const RETRY_UNSUPPORTED: Duration = Duration::from_secs(30);

/// The reply stream of the server side of `Frames`.
pub type ReplyStream = Pin<Box<dyn Stream<Item = Result<RaftFrame, Status>> + Send + 'static>>;

/// The server side's reply queue: replies sent on the sender go out on the
/// stream, in the order they are sent; the stream ends when every sender is
/// gone (the inbound stream ended and every frame was answered).
pub fn reply_channel() -> (mpsc::UnboundedSender<RaftFrame>, ReplyStream) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, Box::pin(UnboundedReceiverStream::new(rx).map(Ok)))
}

/// The reply to frame `id` of `kind`: `result`'s payload, or its refusal
/// as a status code and message.
pub fn reply(id: u64, kind: u32, result: Result<Vec<u8>, Status>) -> RaftFrame {
    match result {
        Ok(payload) => RaftFrame {
            id,
            kind,
            payload: payload.into(),
            ..Default::default()
        },
        Err(status) => RaftFrame {
            id,
            kind,
            code: status.code() as u32,
            error: status.message().to_string(),
            ..Default::default()
        },
    }
}

/// This node's frame links, one per peer.
#[derive(Default)]
pub struct FrameLinks {
    links: Mutex<HashMap<u64, Arc<Link>>>,
    /// Peers that answered UNIMPLEMENTED, and when.
    unsupported: Mutex<HashMap<u64, Instant>>,
}

/// The calls waiting for their replies, by frame id.
type WaitingCalls = HashMap<u64, oneshot::Sender<Result<Bytes, Status>>>;

/// One peer's frame stream: the frames to send, and the calls waiting for
/// their replies by id.
struct Link {
    tx: mpsc::UnboundedSender<RaftFrame>,
    waiting: Mutex<WaitingCalls>,
    next_id: AtomicU64,
    /// The stream ended: calls fail at once, the next one opens a new link.
    closed: AtomicBool,
    /// The peer answered UNIMPLEMENTED.
    unimplemented: AtomicBool,
}

impl Link {
    /// A link sending on `tx`, nobody waiting yet.
    fn new(tx: mpsc::UnboundedSender<RaftFrame>) -> Link {
        Link {
            tx,
            waiting: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            unimplemented: AtomicBool::new(false),
        }
    }

    /// Ends the link: every waiting call fails with `status`.
    fn close(&self, status: &Status) {
        self.closed.store(true, Ordering::SeqCst);
        let waiting: Vec<_> = self
            .waiting
            .lock()
            .map(|mut w| w.drain().collect())
            .unwrap_or_default();
        for (_, tx) in waiting {
            let _ = tx.send(Err(status.clone()));
        }
    }

    /// Hands reply `f` to the call waiting for it (none: it gave up).
    fn complete(&self, f: RaftFrame) {
        let Some(tx) = self.waiting.lock().ok().and_then(|mut w| w.remove(&f.id)) else {
            return;
        };
        let r = if f.code == 0 {
            Ok(f.payload)
        } else {
            Err(Status::new(tonic::Code::from(f.code as i32), f.error))
        };
        let _ = tx.send(r);
    }
}

/// Removes a call's entry when the call is dropped (its caller's time
/// limit), so a reply that never comes leaves nothing behind.
struct Waiting<'a> {
    link: &'a Link,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Ok(mut w) = self.link.waiting.lock() {
            w.remove(&self.id);
        }
    }
}

impl FrameLinks {
    /// No links yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether calls to `node` go as frames: false for
    /// [`RETRY_UNSUPPORTED`] after it answered UNIMPLEMENTED.
    pub fn supported(&self, node: u64) -> bool {
        let Ok(mut u) = self.unsupported.lock() else {
            return false;
        };
        match u.get(&node) {
            Some(at) if at.elapsed() < RETRY_UNSUPPORTED => false,
            Some(_) => {
                u.remove(&node);
                true
            }
            None => true,
        }
    }

    /// Sends one frame (`kind`, for `group`) to `node` and waits for its
    /// reply's payload, with no time limit of its own (the caller bounds it).
    ///
    /// Errors: the peer's refusal (its status code: NOT_FOUND for a group
    /// not open there, FAILED_PRECONDITION for another cluster); UNAVAILABLE
    /// when its address is unknown or the link broke (the call may or may
    /// not have been carried out); UNIMPLEMENTED from an older binary.
    pub async fn call(
        &self,
        peers: &Peers,
        node: u64,
        group: u64,
        kind: u32,
        payload: Bytes,
    ) -> Result<Bytes, Status> {
        let link = self.link(peers, node)?;
        let id = link.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut w) = link.waiting.lock() {
            w.insert(id, tx);
        }
        let _waiting = Waiting { link: &link, id };
        // After the entry: a link closing now has failed it or is seen here.
        if link.closed.load(Ordering::SeqCst) {
            return Err(Status::unavailable(format!(
                "frame link to node {node} closed"
            )));
        }
        let frame = RaftFrame {
            id,
            group_id: group,
            kind,
            payload,
            cluster_id: peers.cluster_id(),
            ..Default::default()
        };
        if link.tx.send(frame).is_err() {
            return Err(Status::unavailable(format!(
                "frame link to node {node} closed"
            )));
        }
        rx.await
            .unwrap_or_else(|_| Err(Status::unavailable("frame link dropped the call")))
    }

    /// The open link to `node`, or a new one.
    fn link(&self, peers: &Peers, node: u64) -> Result<Arc<Link>, Status> {
        let mut links = self
            .links
            .lock()
            .map_err(|_| Status::internal("frame links poisoned"))?;
        if let Some(l) = links.get(&node) {
            if !l.closed.load(Ordering::SeqCst) {
                return Ok(l.clone());
            }
            if l.unimplemented.load(Ordering::SeqCst) {
                if let Ok(mut u) = self.unsupported.lock() {
                    u.insert(node, Instant::now());
                }
            }
        }
        let channel = peers
            .channel(node)
            .ok_or_else(|| Status::unavailable(format!("no address known for node {node}")))?;
        let client = RaftTransportClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let (tx, rx) = mpsc::unbounded_channel();
        let link = Arc::new(Link::new(tx));
        tokio::spawn(run(link.clone(), client, rx));
        links.insert(node, link.clone());
        Ok(link)
    }
}

/// Runs `link`: opens the `Frames` call with the frames sent to `rx` as its
/// request stream, and hands every reply to its waiting call, until the
/// stream ends.
async fn run(
    link: Arc<Link>,
    mut client: RaftTransportClient<super::secret::PeerChannel>,
    rx: mpsc::UnboundedReceiver<RaftFrame>,
) {
    let status = match client.frames(UnboundedReceiverStream::new(rx)).await {
        Ok(response) => {
            let mut replies = response.into_inner();
            loop {
                match replies.next().await {
                    Some(Ok(f)) => link.complete(f),
                    Some(Err(status)) => break status,
                    None => break Status::unavailable("frame stream ended"),
                }
            }
        }
        Err(status) => {
            if status.code() == tonic::Code::Unimplemented {
                link.unimplemented.store(true, Ordering::SeqCst);
            }
            status
        }
    };
    tracing::debug!(error = %status, "frame link closed");
    link.close(&status);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calls waiting on `link`, or an error when its lock is poisoned.
    fn waiting(link: &Link) -> anyhow::Result<std::sync::MutexGuard<'_, WaitingCalls>> {
        link.waiting
            .lock()
            .map_err(|_| anyhow::anyhow!("waiting calls poisoned"))
    }

    #[test]
    fn a_refusal_keeps_its_code_and_message() -> anyhow::Result<()> {
        let f = reply(7, APPEND, Err(Status::not_found("group 3 is not open")));
        assert_eq!((f.id, f.kind), (7, APPEND));
        assert_eq!(f.code, tonic::Code::NotFound as u32);
        let link = Link::new(mpsc::unbounded_channel().0);
        let (tx, mut rx) = oneshot::channel();
        waiting(&link)?.insert(7, tx);
        link.complete(f);
        let status = rx
            .try_recv()?
            .err()
            .ok_or_else(|| anyhow::anyhow!("not refused"))?;
        assert_eq!(status.code(), tonic::Code::NotFound);
        assert_eq!(status.message(), "group 3 is not open");
        Ok(())
    }

    #[test]
    fn closing_a_link_fails_every_waiting_call() -> anyhow::Result<()> {
        let link = Link::new(mpsc::unbounded_channel().0);
        let mut rxs = Vec::new();
        for id in 0..3 {
            let (tx, rx) = oneshot::channel();
            waiting(&link)?.insert(id, tx);
            rxs.push(rx);
        }
        link.close(&Status::unavailable("gone"));
        assert!(link.closed.load(Ordering::SeqCst));
        for mut rx in rxs {
            let status = rx
                .try_recv()?
                .err()
                .ok_or_else(|| anyhow::anyhow!("not failed"))?;
            assert_eq!(status.code(), tonic::Code::Unavailable);
        }
        assert!(waiting(&link)?.is_empty());
        Ok(())
    }

    /// A peer whose stream ended in UNIMPLEMENTED (an older binary) gets
    /// unary calls; any other peer keeps frames, over a new link.
    #[tokio::test]
    async fn a_peer_that_does_not_know_frames_gets_unary_calls() -> anyhow::Result<()> {
        let peers = Peers::new(1, 0);
        peers.set_addr(2, "127.0.0.1:9");
        peers.set_addr(3, "127.0.0.1:9");
        let links = FrameLinks::new();
        for (node, unimplemented) in [(2, true), (3, false)] {
            let old = Arc::new(Link::new(mpsc::unbounded_channel().0));
            old.unimplemented.store(unimplemented, Ordering::SeqCst);
            old.close(&Status::unavailable("gone"));
            links
                .links
                .lock()
                .map_err(|_| anyhow::anyhow!("links poisoned"))?
                .insert(node, old.clone());
            let new = links.link(&peers, node)?;
            assert!(!Arc::ptr_eq(&old, &new), "a closed link is replaced");
        }
        assert!(!links.supported(2));
        assert!(links.supported(3));
        assert!(links.supported(4), "a peer not met yet");
        Ok(())
    }

    #[test]
    fn a_reply_nobody_waits_for_is_dropped() -> anyhow::Result<()> {
        let link = Link::new(mpsc::unbounded_channel().0);
        {
            let (tx, _rx) = oneshot::channel();
            waiting(&link)?.insert(5, tx);
            let _w = Waiting { link: &link, id: 5 };
        }
        assert!(waiting(&link)?.is_empty(), "the guard removed it");
        link.complete(reply(5, VOTE, Ok(vec![1])));
        Ok(())
    }
}
