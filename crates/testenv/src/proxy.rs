//! A loopback TCP proxy that cuts connections at random, for connection-fault tests.
//!
//! It forwards bytes untouched (TLS passes through: the apiserver's certificate is valid for
//! 127.0.0.1 on any port). While cutting is on, each connection lives 100 ms plus a random part of 1,900 ms and
//! is then closed on both sides mid-stream — a watch, a list or a status write in flight.
//! Deterministic for a seed: connection `n`'s lifetime is derived from `(seed, n)`.
//!
//! While black-holing is on, nothing is forwarded and nothing is closed: open connections
//! stall (the kernel still acknowledges what the client sends, so TCP keepalive sees a live
//! peer) and new ones are accepted but never answered — an apiserver that hangs, or a route
//! that drops packets. When it is lifted, the stalled connections are closed.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct CuttingProxy {
    addr: SocketAddr,
    cutting: Arc<AtomicBool>,
    black_hole: Arc<AtomicBool>,
    cuts: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl CuttingProxy {
    /// Listens on a free loopback port and forwards every connection to `target` (a loopback
    /// address). Cutting starts off.
    ///
    /// # Panics
    /// If `target` is not a loopback address: tests contact nothing else.
    pub async fn start(target: SocketAddr, seed: u64) -> std::io::Result<Self> {
        assert!(target.ip().is_loopback(), "tests only contact loopback addresses");
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cutting = Arc::new(AtomicBool::new(false));
        let black_hole = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicU64::new(0));
        let (c, b, n) = (cutting.clone(), black_hole.clone(), cuts.clone());
        let accept = tokio::spawn(async move {
            let mut connection = 0_u64;
            while let Ok((inbound, _)) = listener.accept().await {
                connection += 1;
                let lifetime = Duration::from_millis(100 + mix(seed, connection) % 1_900);
                let faults = Faults {
                    cutting: c.clone(),
                    black_hole: b.clone(),
                    cuts: n.clone(),
                };
                tokio::spawn(forward(inbound, target, lifetime, faults));
            }
        });
        Ok(Self {
            addr,
            cutting,
            black_hole,
            cuts,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Turns cutting on or off (connections opened meanwhile are cut once their lifetime is
    /// over and cutting is on).
    pub fn set_cutting(&self, on: bool) {
        self.cutting.store(on, Ordering::SeqCst);
    }

    /// Turns black-holing on or off (see the module documentation).
    pub fn set_black_hole(&self, on: bool) {
        self.black_hole.store(on, Ordering::SeqCst);
    }

    /// Connections cut so far.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::SeqCst)
    }

    /// A copy of `kubeconfig` whose server is this proxy, written to `path`.
    pub fn kubeconfig(&self, kubeconfig: &std::path::Path, path: &std::path::Path) -> std::io::Result<()> {
        let text = std::fs::read_to_string(kubeconfig)?;
        let proxied: Vec<String> = text
            .lines()
            .map(|line| match line.split_once("server:") {
                Some((indent, _)) => format!("{indent}server: https://{}", self.addr),
                None => line.to_owned(),
            })
            .collect();
        std::fs::write(path, proxied.join("\n") + "\n")
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// The switches shared by every connection of a proxy.
struct Faults {
    cutting: Arc<AtomicBool>,
    black_hole: Arc<AtomicBool>,
    cuts: Arc<AtomicU64>,
}

/// Resolves once `flag` reads `on` (checked every 20 ms).
async fn until(flag: &AtomicBool, on: bool) {
    while flag.load(Ordering::SeqCst) != on {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn forward(mut inbound: TcpStream, target: SocketAddr, lifetime: Duration, faults: Faults) {
    // A connection made into the black hole is accepted and never answered.
    until(&faults.black_hole, false).await;
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    let cut = async {
        loop {
            tokio::time::sleep(lifetime).await;
            if faults.cutting.load(Ordering::SeqCst) {
                return;
            }
        }
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        () = cut => {
            faults.cuts.fetch_add(1, Ordering::SeqCst);
        }
        () = until(&faults.black_hole, true) => {
            // Stall with both sockets open; close them once the black hole is lifted.
            until(&faults.black_hole, false).await;
        }
    }
}

fn mix(seed: u64, n: u64) -> u64 {
    let mut z = seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// An echo server behind the proxy: bytes pass while cutting is off; with cutting on the
    /// connection is closed within its lifetime and counted.
    /// A loopback echo server's address.
    async fn echo() -> SocketAddr {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0_u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        target
    }

    #[tokio::test]
    async fn forwards_then_cuts() {
        let target = echo().await;
        let proxy = CuttingProxy::start(target, 7).await.unwrap();
        let mut client = TcpStream::connect(proxy.addr()).await.unwrap();
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0_u8; 4];
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        tokio::time::sleep(Duration::from_millis(2_200)).await;
        client.write_all(b"pong").await.unwrap();
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(proxy.cuts(), 0, "no cut while cutting is off");

        proxy.set_cutting(true);
        let closed = tokio::time::timeout(Duration::from_secs(5), async {
            let mut rest = Vec::new();
            client.read_to_end(&mut rest).await
        })
        .await;
        assert!(closed.is_ok(), "the connection is cut in time");
        assert_eq!(proxy.cuts(), 1);
    }

    #[tokio::test]
    async fn a_black_hole_stalls_open_and_new_connections_then_closes_them() {
        let proxy = CuttingProxy::start(echo().await, 7).await.unwrap();
        let mut open = TcpStream::connect(proxy.addr()).await.unwrap();
        open.write_all(b"ping").await.unwrap();
        let mut buf = [0_u8; 4];
        open.read_exact(&mut buf).await.unwrap();
        proxy.set_black_hole(true);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        for stream in [&mut open, &mut fresh] {
            stream.write_all(b"ping").await.unwrap();
            let answer = tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buf)).await;
            assert!(answer.is_err(), "nothing comes back and nothing is closed");
        }
        proxy.set_black_hole(false);
        let closed = tokio::time::timeout(Duration::from_secs(5), open.read(&mut buf)).await;
        assert!(
            matches!(closed, Ok(Ok(0) | Err(_))),
            "a stalled connection is closed once the black hole is lifted"
        );
    }
}
