//! Minimal AMQP 0-9-1 over a raw tokio `TcpStream`, for tests that send bytes
//! no client library would (bad protocol headers, garbage frames, oversized
//! frames). Frame layout: type u8, channel u16, size u32, payload, 0xCE
//! (AMQP 0-9-1 spec §2.3.5).

use anyhow::{anyhow, bail};
use std::time::Duration;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// `AMQP\0\0\x09\x01`, the protocol header of AMQP 0-9-1.
pub const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";
pub const FRAME_METHOD: u8 = 1;
pub const FRAME_HEADER: u8 = 2;
pub const FRAME_BODY: u8 = 3;
pub const FRAME_HEARTBEAT: u8 = 8;
pub const FRAME_END: u8 = 0xCE;

/// One decoded frame.
#[derive(Debug, Clone)]
pub struct Frame {
    pub kind: u8,
    pub channel: u16,
    pub payload: Vec<u8>,
}

impl Frame {
    /// (class id, method id) of a method frame.
    pub fn method(&self) -> Option<(u16, u16)> {
        if self.kind != FRAME_METHOD || self.payload.len() < 4 {
            return None;
        }
        Some((
            u16::from_be_bytes([self.payload[0], self.payload[1]]),
            u16::from_be_bytes([self.payload[2], self.payload[3]]),
        ))
    }

    /// (reply code, reply text) of a connection.close (10,50) or channel.close (20,40).
    pub fn close_reason(&self) -> Option<(u16, String)> {
        match self.method()? {
            (10, 50) | (20, 40) => {
                let p = &self.payload[4..];
                let code = u16::from_be_bytes([*p.first()?, *p.get(1)?]);
                let len = *p.get(2)? as usize;
                let text = String::from_utf8_lossy(p.get(3..3 + len)?).into_owned();
                Some((code, text))
            }
            _ => None,
        }
    }
}

/// Encodes a frame.
pub fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 8);
    out.push(kind);
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.push(FRAME_END);
    out
}

/// Method payload builder.
#[derive(Default)]
pub struct Args(pub Vec<u8>);

impl Args {
    pub fn method(class: u16, method: u16) -> Args {
        let mut a = Args::default();
        a.0.extend_from_slice(&class.to_be_bytes());
        a.0.extend_from_slice(&method.to_be_bytes());
        a
    }
    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    pub fn u16(mut self, v: u16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn shortstr(mut self, v: &str) -> Self {
        self.0.push(v.len() as u8);
        self.0.extend_from_slice(v.as_bytes());
        self
    }
    pub fn longstr(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(&(v.len() as u32).to_be_bytes());
        self.0.extend_from_slice(v);
        self
    }
    /// An empty field table.
    pub fn empty_table(self) -> Self {
        self.u32(0)
    }
}

/// A raw AMQP connection.
pub struct RawConn {
    pub stream: TcpStream,
    /// frame_max agreed in tune/tune-ok (0 before the handshake).
    pub frame_max: u32,
    /// heartbeat the server proposed in connection.tune.
    pub server_heartbeat: u16,
    /// channel_max the server proposed in connection.tune (0 before the handshake).
    pub server_channel_max: u16,
}

/// "host:port" of an amqp URI (`amqp://user:pass@host:port/vhost`).
pub fn addr_of(uri: &str) -> anyhow::Result<String> {
    let rest = uri
        .split("://")
        .nth(1)
        .ok_or_else(|| anyhow!("bad uri {uri}"))?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    let hostport = hostport.rsplit('@').next().unwrap_or(hostport);
    Ok(if hostport.contains(':') {
        hostport.to_string()
    } else {
        format!("{hostport}:5672")
    })
}

impl RawConn {
    pub async fn connect(uri: &str) -> anyhow::Result<RawConn> {
        let stream =
            tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr_of(uri)?))
                .await??;
        Ok(RawConn {
            stream,
            frame_max: 0,
            server_heartbeat: 0,
            server_channel_max: 0,
        })
    }

    pub async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await
    }

    pub async fn send_method(&mut self, channel: u16, args: Args) -> std::io::Result<()> {
        let f = frame(FRAME_METHOD, channel, &args.0);
        self.send(&f).await
    }

    /// Reads exactly `n` bytes or fails on EOF/timeout.
    pub async fn read_exact(&mut self, n: usize, limit: Duration) -> anyhow::Result<Vec<u8>> {
        let mut buf = vec![0u8; n];
        tokio::time::timeout(limit, self.stream.read_exact(&mut buf)).await??;
        Ok(buf)
    }

    /// Reads one frame. `Ok(None)` on a clean EOF or a reset before the frame started.
    pub async fn read_frame(&mut self, limit: Duration) -> anyhow::Result<Option<Frame>> {
        let mut head = [0u8; 7];
        match tokio::time::timeout(limit, self.stream.read_exact(&mut head)).await {
            Err(_) => bail!("no frame within {limit:?}"),
            Ok(Err(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                return Ok(None);
            }
            Ok(Err(e)) => return Err(e.into()),
            Ok(Ok(_)) => {}
        }
        let size = u32::from_be_bytes([head[3], head[4], head[5], head[6]]) as usize;
        let mut rest = vec![0u8; size + 1];
        tokio::time::timeout(limit, self.stream.read_exact(&mut rest)).await??;
        if rest[size] != FRAME_END {
            bail!("frame end octet was {:#x}", rest[size]);
        }
        rest.truncate(size);
        Ok(Some(Frame {
            kind: head[0],
            channel: u16::from_be_bytes([head[1], head[2]]),
            payload: rest,
        }))
    }

    /// Reads frames (skipping heartbeats) until a method frame arrives.
    pub async fn read_method(&mut self, limit: Duration) -> anyhow::Result<Option<Frame>> {
        loop {
            match self.read_frame(limit).await? {
                Some(f) if f.kind == FRAME_HEARTBEAT => continue,
                other => return Ok(other),
            }
        }
    }

    /// Performs the whole handshake (PLAIN guest/guest, vhost "/", heartbeat 0)
    /// up to connection.open-ok.
    pub async fn handshake(uri: &str) -> anyhow::Result<RawConn> {
        Self::handshake_with_heartbeat(uri, 0).await
    }

    /// [`RawConn::handshake`] asking for a `heartbeat` interval (s) in tune-ok;
    /// the connection itself never sends a heartbeat.
    pub async fn handshake_with_heartbeat(uri: &str, heartbeat: u16) -> anyhow::Result<RawConn> {
        let t = Duration::from_secs(10);
        let mut c = RawConn::connect(uri).await?;
        c.send(PROTOCOL_HEADER).await?;
        let start = c
            .read_method(t)
            .await?
            .ok_or_else(|| anyhow!("EOF before connection.start"))?;
        if start.method() != Some((10, 10)) {
            bail!("expected connection.start, got {start:?}");
        }
        let start_ok = Args::method(10, 11)
            .empty_table()
            .shortstr("PLAIN")
            .longstr(b"\0guest\0guest")
            .shortstr("en_US");
        c.send_method(0, start_ok).await?;
        let tune = c
            .read_method(t)
            .await?
            .ok_or_else(|| anyhow!("EOF before connection.tune"))?;
        if tune.method() != Some((10, 30)) {
            bail!(
                "expected connection.tune, got {tune:?} {:?}",
                tune.close_reason()
            );
        }
        let p = &tune.payload[4..];
        let channel_max = u16::from_be_bytes([p[0], p[1]]);
        let frame_max = u32::from_be_bytes([p[2], p[3], p[4], p[5]]);
        c.server_heartbeat = u16::from_be_bytes([p[6], p[7]]);
        c.server_channel_max = channel_max;
        c.frame_max = frame_max;
        c.send_method(
            0,
            Args::method(10, 31)
                .u16(channel_max)
                .u32(frame_max)
                .u16(heartbeat),
        )
        .await?;
        c.send_method(0, Args::method(10, 40).shortstr("/").shortstr("").u8(0))
            .await?;
        let open_ok = c
            .read_method(t)
            .await?
            .ok_or_else(|| anyhow!("EOF before connection.open-ok"))?;
        if open_ok.method() != Some((10, 41)) {
            bail!(
                "expected connection.open-ok, got {open_ok:?} {:?}",
                open_ok.close_reason()
            );
        }
        Ok(c)
    }

    /// Reads until connection.close arrives (returns its code and text, after
    /// answering close-ok) or the socket is closed (returns None).
    pub async fn expect_connection_close(
        &mut self,
        limit: Duration,
    ) -> anyhow::Result<Option<(u16, String)>> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                bail!("connection neither closed nor sent connection.close within {limit:?}");
            }
            let f = match self.read_frame(left).await {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(None),
                Err(e) => {
                    if let Some(io) = e.downcast_ref::<std::io::Error>() {
                        if matches!(
                            io.kind(),
                            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
                        ) {
                            return Ok(None);
                        }
                    }
                    return Err(e);
                }
            };
            if f.method() == Some((10, 50)) {
                let reason = f.close_reason();
                let _ = self.send_method(0, Args::method(10, 51)).await;
                return Ok(reason);
            }
        }
    }

    /// Reads until EOF (true) or until `limit` passes (false).
    pub async fn wait_eof(&mut self, limit: Duration) -> bool {
        let mut buf = [0u8; 4096];
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(deadline, self.stream.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
            }
        }
    }
}
