//! One connection to a Redis server: TCP or TLS (rustls), the handshake (`AUTH`, `SELECT`),
//! and every write and read of a pipeline under a [`Budget`] — the call's deadline and its
//! cancel token, checked between reads and while a read waits, so a server that answers
//! slowly, never, or endlessly cannot hold a call past its deadline. Replies are parsed by
//! `reply`, bounded.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ::redis::Value;

use super::config::NodeAddr;
use super::reply::{Limits, ReplyReader};
use crate::connector::CancelToken;
use crate::sync::Arc;

/// The longest a read or write waits before the deadline and the cancel token are looked at
/// again.
const POLL: Duration = Duration::from_millis(20);

/// What a call may still spend: its deadline, and the token that cancels it.
#[derive(Clone, Copy)]
pub(crate) struct Budget<'a> {
    pub deadline: Instant,
    pub cancel: Option<&'a CancelToken>,
}

impl Budget<'_> {
    /// How long until the deadline (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// `Err` once the call is cancelled or past its deadline.
    pub fn check(&self) -> Result<(), ConnError> {
        if self.cancel.is_some_and(|c| c.is_cancelled()) {
            return Err(ConnError::Cancelled);
        }
        if Instant::now() >= self.deadline {
            return Err(ConnError::Timeout);
        }
        Ok(())
    }

    /// How long one blocking read or write may wait now.
    fn slice(&self) -> Duration {
        self.remaining().clamp(Duration::from_millis(1), POLL)
    }
}

/// Why a connection's write or read failed. Each leaves the connection unusable.
#[derive(Debug)]
pub(crate) enum ConnError {
    /// The call's deadline passed.
    Timeout,
    /// The call's cancel token fired.
    Cancelled,
    /// The socket failed or the server closed it.
    Io(std::io::Error),
    /// The server sent something that is not a reply this client accepts (too large, too
    /// deep, a RESP3 frame, malformed); the text says what, never the bytes.
    Protocol(String),
}

impl std::fmt::Display for ConnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnError::Timeout => f.write_str("deadline passed"),
            ConnError::Cancelled => f.write_str("cancelled"),
            ConnError::Io(e) => write!(f, "{e}"),
            ConnError::Protocol(p) => write!(f, "protocol: {p}"),
        }
    }
}

/// The socket: plain, or TLS over it.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(t) => &t.sock,
        }
    }
}

/// A TLS stream's reads and writes go one socket read or write at a time, each within the
/// socket's timeout slice, and answer `WouldBlock` ("not yet") when that one did not finish
/// the job: the caller looks at its deadline and cancel token before the next. rustls's own
/// `Stream` reads on until a whole record (up to 16 KiB) has come and writes until all it
/// holds is sent, so a server trickling a byte every few milliseconds would hold a call
/// past its deadline for minutes.
impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(t) if planted!("redis-tls-whole-records") => t.read(buf),
            Stream::Tls(t) => {
                // Plaintext already there, or the end of the stream (clean, or not).
                match t.conn.reader().read(buf) {
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    done => return done,
                }
                // Something to send first (an alert, a key update).
                if t.conn.wants_write() {
                    t.conn.write_tls(&mut t.sock)?;
                    return Err(ErrorKind::WouldBlock.into());
                }
                t.conn.read_tls(&mut t.sock)?;
                t.conn
                    .process_new_packets()
                    .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))?;
                // `WouldBlock` while the record is not whole yet.
                t.conn.reader().read(buf)
            }
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(t) if planted!("redis-tls-whole-records") => t.write(buf),
            Stream::Tls(t) => {
                // What was taken before goes out first, one socket write per call.
                if t.conn.wants_write() {
                    t.conn.write_tls(&mut t.sock)?;
                    if t.conn.wants_write() {
                        return Err(ErrorKind::WouldBlock.into());
                    }
                }
                // Taken whole or in part (up to rustls's buffer limit), sent by the calls
                // after.
                t.conn.writer().write(buf)
            }
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(t) if planted!("redis-tls-whole-records") => t.flush(),
            Stream::Tls(t) => {
                if t.conn.wants_write() {
                    if t.conn.write_tls(&mut t.sock)? == 0 {
                        return Err(ErrorKind::WriteZero.into());
                    }
                    if t.conn.wants_write() {
                        return Err(ErrorKind::WouldBlock.into());
                    }
                }
                t.sock.flush()
            }
        }
    }
}

/// One step of a TLS handshake: one socket write of what it has to send, else one socket
/// read and the records it completed.
fn tls_handshake_step(
    t: &mut rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
) -> std::io::Result<()> {
    if t.conn.wants_write() {
        t.conn.write_tls(&mut t.sock)?;
        return Ok(());
    }
    if t.conn.read_tls(&mut t.sock)? == 0 {
        return Err(std::io::Error::new(
            ErrorKind::UnexpectedEof,
            "the server closed the connection",
        ));
    }
    t.conn
        .process_new_packets()
        .map(drop)
        .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e))
}

/// Whether an I/O error only means "not yet" (a read or write timeout slice ran out).
fn not_yet(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

/// Why [`Conn::open`] failed: the text (naming the step, never a credential), and whether
/// the server broke the protocol (a reply this client does not accept, or of a kind the
/// command does not answer), which the tier counts.
#[derive(Debug)]
pub(crate) struct OpenError {
    pub text: String,
    pub protocol: bool,
}

impl OpenError {
    fn other(text: String) -> OpenError {
        OpenError {
            text,
            protocol: false,
        }
    }
}

/// What [`Conn::idle_state`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Idle {
    /// Nothing waiting: the next reply read is the next command's.
    Clean,
    /// Bytes no command asked for.
    Stray,
    /// The server closed it (or the socket failed).
    Closed,
}

/// The handshake's settings: credentials and database.
pub(crate) struct Login<'a> {
    pub username: Option<&'a str>,
    pub password: Option<&'a str>,
    pub db: i64,
}

/// A connection: the stream and its read buffer.
pub(crate) struct Conn {
    reader: ReplyReader<Stream>,
}

impl Conn {
    /// Connects to the first of `addrs` (`addr`'s, resolved) that accepts (TLS if `tls` is
    /// set, `addr`'s host the server name), then authenticates and selects the database, all
    /// within `budget`. The error text names the step, never a credential.
    pub fn open(
        addr: &NodeAddr,
        addrs: &[SocketAddr],
        tls: Option<&Arc<rustls::ClientConfig>>,
        login: &Login<'_>,
        budget: Budget<'_>,
    ) -> Result<Conn, OpenError> {
        Self::open_plain_or_tls(addr, addrs, tls, budget)
            .map_err(OpenError::other)
            .and_then(|mut conn| conn.login(login, budget).map(|()| conn))
    }

    /// The connection, before the handshake.
    fn open_plain_or_tls(
        addr: &NodeAddr,
        addrs: &[SocketAddr],
        tls: Option<&Arc<rustls::ClientConfig>>,
        budget: Budget<'_>,
    ) -> Result<Conn, String> {
        let sock = tcp_connect(addrs, budget)?;
        let _ = sock.set_nodelay(true);
        let stream = match tls {
            None => Stream::Plain(sock),
            Some(cfg) => {
                let name = rustls::pki_types::ServerName::try_from(addr.host.clone())
                    .map_err(|_| "TLS: the host is not a valid server name".to_owned())?;
                let conn = rustls::ClientConnection::new(Arc::clone(cfg), name)
                    .map_err(|e| format!("TLS: {e}"))?;
                let mut t = rustls::StreamOwned::new(conn, sock);
                // The deadline is looked at between socket reads and writes (rustls's
                // `complete_io` would read on until the handshake is done, however slowly
                // the server's bytes come).
                while t.conn.is_handshaking() || t.conn.wants_write() {
                    budget.check().map_err(|e| format!("TLS handshake: {e}"))?;
                    let slice = Some(budget.slice());
                    let _ = t.sock.set_read_timeout(slice);
                    let _ = t.sock.set_write_timeout(slice);
                    // Planted bug `redis-tls-whole-records` (scripts/plants.sh): rustls's
                    // own I/O, which reads and writes until done.
                    let step = if planted!("redis-tls-whole-records") {
                        t.conn.complete_io(&mut t.sock).map(drop)
                    } else {
                        tls_handshake_step(&mut t)
                    };
                    match step {
                        Ok(()) => {}
                        Err(e) if not_yet(&e) => {}
                        Err(e) => return Err(format!("TLS handshake: {e}")),
                    }
                }
                Stream::Tls(Box::new(t))
            }
        };
        Ok(Conn {
            reader: ReplyReader::new(stream),
        })
    }

    /// `AUTH` and `SELECT`, as one pipeline. A refusal is named by its error code only:
    /// the reply to a command that carried the credentials is not repeated.
    fn login(&mut self, login: &Login<'_>, budget: Budget<'_>) -> Result<(), OpenError> {
        let mut cmds: Vec<Vec<&[u8]>> = Vec::new();
        let db = login.db.to_string();
        if let Some(pw) = login.password {
            let mut auth: Vec<&[u8]> = vec![b"AUTH"];
            if let Some(u) = login.username {
                auth.push(u.as_bytes());
            }
            auth.push(pw.as_bytes());
            cmds.push(auth);
        }
        if login.db != 0 {
            cmds.push(vec![b"SELECT", db.as_bytes()]);
        }
        if cmds.is_empty() {
            return Ok(());
        }
        let refs: Vec<&[&[u8]]> = cmds.iter().map(|c| c.as_slice()).collect();
        let packed = super::resp::pack(&refs);
        self.send(&packed, budget)
            .map_err(|e| OpenError::other(format!("handshake: {e}")))?;
        let limits = Limits::control();
        for (i, _) in cmds.iter().enumerate() {
            let v = self.read_reply(&limits, budget).map_err(|e| OpenError {
                protocol: matches!(e, ConnError::Protocol(_)),
                text: format!("handshake: {e}"),
            })?;
            let step = if login.password.is_some() && i == 0 {
                "AUTH"
            } else {
                "SELECT"
            };
            match &v {
                Value::Okay => {}
                Value::SimpleString(s) if s == "OK" => {}
                Value::ServerError(e) => {
                    let code = match e.code() {
                        c @ ("WRONGPASS" | "NOAUTH" | "NOPERM" | "ERR" | "LOADING") => c,
                        _ => "an error",
                    };
                    return Err(OpenError::other(format!("{step} refused ({code})")));
                }
                other => {
                    return Err(OpenError {
                        text: format!("{step} answered {}", super::resp::kind(other)),
                        protocol: true,
                    })
                }
            }
        }
        if self.buffered() > 0 {
            return Err(OpenError {
                text: format!("handshake: {} bytes after its replies", self.buffered()),
                protocol: true,
            });
        }
        Ok(())
    }

    /// Bytes read and not yet parsed (after a pipeline's last reply: bytes nobody asked for).
    pub fn buffered(&self) -> usize {
        self.reader.buffered()
    }

    /// What an idle connection holds before it is used again: a server's reply arrives only
    /// for a command, so any byte waiting is one no command of ours asked for (a stray reply
    /// that would answer the next command in its place), and end of stream is a connection
    /// the server closed. Looks without blocking: the bytes already buffered, then the
    /// socket's. On a TLS connection only the buffered bytes are looked at (the socket may
    /// hold the server's session tickets, which are no reply).
    pub fn idle_state(&mut self) -> Idle {
        if self.reader.buffered() > 0 {
            return Idle::Stray;
        }
        let Stream::Plain(sock) = self.reader.inner_mut() else {
            return Idle::Clean;
        };
        match peek_now(sock) {
            Ok(0) => Idle::Closed,
            Ok(_) => Idle::Stray,
            Err(e) if e.kind() == ErrorKind::WouldBlock => Idle::Clean,
            Err(_) => Idle::Closed,
        }
    }

    /// Writes `bytes` whole, within `budget`.
    pub fn send(&mut self, bytes: &[u8], budget: Budget<'_>) -> Result<(), ConnError> {
        let stream = self.reader.inner_mut();
        let mut done = 0;
        while done < bytes.len() {
            budget.check()?;
            let _ = stream.tcp().set_write_timeout(Some(budget.slice()));
            match stream.write(&bytes[done..]) {
                Ok(0) => {
                    return Err(ConnError::Io(std::io::Error::new(
                        ErrorKind::WriteZero,
                        "the connection took no bytes",
                    )))
                }
                Ok(n) => done += n,
                Err(e) if not_yet(&e) => {}
                Err(e) => return Err(ConnError::Io(e)),
            }
        }
        loop {
            budget.check()?;
            let _ = stream.tcp().set_write_timeout(Some(budget.slice()));
            match stream.flush() {
                Ok(()) => return Ok(()),
                Err(e) if not_yet(&e) => {}
                Err(e) => return Err(ConnError::Io(e)),
            }
        }
    }

    /// Reads one reply within `budget` and `limits`.
    pub fn read_reply(&mut self, limits: &Limits, budget: Budget<'_>) -> Result<Value, ConnError> {
        self.reader
            .read_value(limits, &mut |stream: &mut Stream, buf: &mut [u8]| loop {
                budget.check()?;
                let _ = stream.tcp().set_read_timeout(Some(budget.slice()));
                match stream.read(buf) {
                    Ok(0) => {
                        return Err(ConnError::Io(std::io::Error::new(
                            ErrorKind::UnexpectedEof,
                            "the server closed the connection",
                        )))
                    }
                    Ok(n) => return Ok(n),
                    Err(e) if not_yet(&e) => {}
                    Err(e) => return Err(ConnError::Io(e)),
                }
            })
    }
}

/// Looks at the next byte waiting on `sock` without taking it and without waiting: `Ok(0)`
/// at end of stream, `WouldBlock` when none waits. One `recv(MSG_PEEK | MSG_DONTWAIT)` on
/// Unix (every call that reuses a connection makes it), where the socket stays blocking.
fn peek_now(sock: &TcpStream) -> std::io::Result<usize> {
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        let mut byte = 0u8;
        // SAFETY: `sock` owns an open socket descriptor for the whole call, and `recv` writes
        // at most 1 byte into `byte`, which lives on this stack frame past the call.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
    #[cfg(not(unix))]
    {
        sock.set_nonblocking(true)?;
        let peeked = sock.peek(&mut [0u8; 1]);
        sock.set_nonblocking(false)?;
        peeked
    }
}

/// A TCP connection to the first of `addrs` that accepts within the budget. (The name was
/// resolved before, within the budget too: `resolve`.)
fn tcp_connect(addrs: &[SocketAddr], budget: Budget<'_>) -> Result<TcpStream, String> {
    let mut last = String::from("resolve: no address");
    for a in addrs {
        budget.check().map_err(|e| e.to_string())?;
        match TcpStream::connect_timeout(a, budget.remaining().max(Duration::from_millis(1))) {
            Ok(s) => return Ok(s),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}
