//! The AMQP connection state machine fed arbitrary frame sequences over a real socket
//! to a real single-node broker (started once per fuzzing process, data in /dev/shm):
//! after the handshake, every frame of the input goes out well framed (so the input
//! reaches the method handlers, not only the frame reader), then a connection.close.
//! The broker must answer that close (close-ok, or its own connection.close for an
//! error) within 10 s — a hang is a crash — and must never panic (libFuzzer aborts
//! on a panic in any thread).
//!
//! Input: repeated `[kind][channel][len lo][len hi][payload: len bytes]`; `kind % 4`
//! picks method (1), content header (2), body (3) or heartbeat (8); `channel % 4`
//! the channel; `len % 1024` the payload size (cut at the input's end). Seeds are
//! real pika sessions re-encoded this way (`broker/fuzz/seeds/connection/`). Every 500
//! runs the queues and exchanges the inputs declared are deleted.
#![no_main]
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use quorumq::config::Config;
use quorumq::node::Broker;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Harness {
    rt: tokio::runtime::Runtime,
    addr: SocketAddr,
    broker: Arc<Broker>,
    runs: AtomicU64,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        // QUORUMQ_FUZZ_LOG=quorumq=trace shows the broker's side of a hang.
        if let Ok(filter) = std::env::var("QUORUMQ_FUZZ_LOG") {
            tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                .init();
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let dir = std::env::temp_dir().join(format!("quorumq-fuzz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("data dir");
        let (addr, broker) = rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("AMQP listener");
            let addr = listener.local_addr().expect("addr");
            let config = Config {
                data_dir: dir,
                amqp_listen: addr.to_string(),
                cluster_listen: "127.0.0.1:0".into(),
                ..Config::default()
            };
            let (broker, _services) = Broker::open(config).await.expect("open broker");
            broker.start().await.expect("start broker");
            tokio::spawn(quorumq::amqp::server::run(listener, broker.clone()));
            (addr, broker)
        });
        Harness {
            rt,
            addr,
            broker,
            runs: AtomicU64::new(0),
        }
    })
}

fn frame(out: &mut Vec<u8>, kind: u8, channel: u16, payload: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.push(0xCE);
}

fn shortstr(p: &mut Vec<u8>, s: &[u8]) {
    p.push(s.len() as u8);
    p.extend_from_slice(s);
}

/// Protocol header, start-ok (PLAIN guest/guest), tune-ok, open "/".
fn handshake() -> Vec<u8> {
    let mut out = b"AMQP\x00\x00\x09\x01".to_vec();
    let mut p = vec![0, 10, 0, 11, 0, 0, 0, 0];
    shortstr(&mut p, b"PLAIN");
    let resp = b"\0guest\0guest";
    p.extend_from_slice(&(resp.len() as u32).to_be_bytes());
    p.extend_from_slice(resp);
    shortstr(&mut p, b"en_US");
    frame(&mut out, 1, 0, &p);
    frame(&mut out, 1, 0, &[0, 10, 0, 31, 0x07, 0xFF, 0, 2, 0, 0, 0, 0]);
    let mut p = vec![0, 10, 0, 40];
    shortstr(&mut p, b"/");
    p.extend_from_slice(&[0, 0]);
    frame(&mut out, 1, 0, &p);
    out
}

/// The input as well-formed frames (see the module doc).
fn frames(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 64);
    let mut rest = data;
    while rest.len() >= 4 {
        let kind = [1u8, 2, 3, 8][usize::from(rest[0] % 4)];
        let channel = u16::from(rest[1] % 4);
        let len = usize::from(u16::from_le_bytes([rest[2], rest[3]]) % 1024);
        rest = &rest[4..];
        let len = len.min(rest.len());
        let channel = if kind == 8 { 0 } else { channel };
        frame(&mut out, kind, channel, &rest[..len]);
        rest = &rest[len..];
    }
    out
}

/// True once `buf` holds a connection.close or close-ok from the server: a method frame
/// on channel 0 (type, channel, 4 size bytes) whose class is 10 and method 50 or 51.
fn closed(buf: &[u8]) -> bool {
    buf.windows(11).any(|w| {
        w[0] == 1 && w[1..3] == [0, 0] && w[7..10] == [0, 10, 0] && matches!(w[10], 50 | 51)
    })
}

/// Deletes every queue and exchange the inputs declared (queues are durable Raft groups,
/// and every exchange and binding is in each meta snapshot: left alone, they would pile
/// up over millions of runs and slow every run down).
async fn delete_all(h: &Harness) {
    let (queues, exchanges): (Vec<String>, Vec<String>) = h
        .broker
        .with_topology(|t| {
            (
                t.queues()
                    .filter(|q| q.vhost == "/")
                    .map(|q| q.name.clone())
                    .collect(),
                t.exchanges("/")
                    .map(|x| x.name.clone())
                    .filter(|n| !n.is_empty() && !n.starts_with("amq."))
                    .collect(),
            )
        })
        .unwrap_or_default();
    if queues.is_empty() && exchanges.is_empty() {
        return;
    }
    let mut bytes = handshake();
    frame(&mut bytes, 1, 1, &[0, 20, 0, 10, 0]);
    for n in &queues {
        let mut p = vec![0, 50, 0, 40, 0, 0];
        shortstr(&mut p, n.as_bytes());
        p.push(0);
        frame(&mut bytes, 1, 1, &p);
    }
    for n in &exchanges {
        let mut p = vec![0, 40, 0, 20, 0, 0];
        shortstr(&mut p, n.as_bytes());
        p.push(0);
        frame(&mut bytes, 1, 1, &p);
    }
    let _ = talk(h.addr, &bytes).await;
}

/// Sends `bytes` then connection.close; reads until the server closes or answers.
async fn talk(addr: SocketAddr, bytes: &[u8]) -> std::io::Result<bool> {
    let mut s = TcpStream::connect(addr).await?;
    let mut out = bytes.to_vec();
    frame(&mut out, 1, 0, &[0, 10, 0, 50, 0, 200, 0, 0, 0, 0]);
    let (mut rd, mut wr) = s.split();
    let mut got = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let write = async {
        // The server may close early (an error); what it did not read does not matter.
        let _ = wr.write_all(&out).await;
        std::future::pending::<()>().await
    };
    let read = async {
        loop {
            match rd.read(&mut chunk).await {
                Ok(0) | Err(_) => return true,
                Ok(n) => {
                    got.extend_from_slice(&chunk[..n]);
                    if closed(&got) {
                        return true;
                    }
                }
            }
        }
    };
    tokio::select! {
        done = read => Ok(done),
        _ = write => unreachable!(),
    }
}

fuzz_target!(|data: &[u8]| {
    let h = harness();
    let mut bytes = handshake();
    bytes.extend_from_slice(&frames(data));
    h.rt.block_on(async {
        match tokio::time::timeout(Duration::from_secs(10), talk(h.addr, &bytes)).await {
            Ok(_) => {}
            Err(_) => panic!("the broker did not answer connection.close within 10 s"),
        }
        if h.runs.fetch_add(1, Ordering::Relaxed) % 500 == 499
            && tokio::time::timeout(Duration::from_secs(30), delete_all(h))
                .await
                .is_err()
        {
            panic!("the broker did not answer the cleanup connection (queue.delete / exchange.delete, then connection.close) within 30 s");
        }
    });
});
