//! Passing memory handles (file descriptors) between the ranks of one host: Unix
//! `SOCK_SEQPACKET` sockets with `SCM_RIGHTS`.
//!
//! The local team's first rank (the *leader*) listens on an abstract Unix socket whose name
//! carries a random nonce, published to the team over the authenticated control plane; every
//! other local rank connects once at init and says which rank it is. Both ends check the peer's
//! kernel-reported credentials (`SO_PEERCRED`): the same uid as ours and exactly the pid that
//! rank announced in the authenticated rendezvous — a process of another user, or another
//! process of ours, cannot pose as a rank. The listener is closed once the team is connected.
//!
//! An exchange ([`LocalLinks::exchange`]) gathers one fd per rank at the leader and sends the
//! whole set back to every rank: each rank ends up with every local rank's fd (its own
//! duplicated), in local-rank order.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixAddr, accept4, bind, connect, getsockopt, listen, recvmsg, sendmsg, socket, sockopt,
};

use crate::bootstrap::RankInfo;
use crate::{Error, Result};

/// Most ranks a local team may have: the kernel passes at most 253 fds per message.
pub(crate) const MAX_LOCAL: usize = 253;

fn sys_err(what: impl Into<String>) -> impl FnOnce(Errno) -> Error {
    let what = what.into();
    move |e| Error::io(what, std::io::Error::from(e))
}

/// Waits until `fd` is readable (or writable), bounded by `deadline`.
fn wait_ready(fd: BorrowedFd<'_>, write: bool, deadline: Instant, what: &str) -> Result<()> {
    let flags = if write {
        PollFlags::POLLOUT
    } else {
        PollFlags::POLLIN
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::io(
                what.to_owned(),
                std::io::Error::from(std::io::ErrorKind::TimedOut),
            ));
        }
        let ms = left.as_millis().clamp(1, 1000) as u16;
        let mut fds = [PollFd::new(fd, flags)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => return Ok(()),
            Err(e) => return Err(sys_err(what)(e)),
        }
    }
}

/// Sends `bytes` and `fds` as one message.
fn send_msg(
    sock: &OwnedFd,
    bytes: &[u8],
    fds: &[RawFd],
    deadline: Instant,
    what: &str,
) -> Result<()> {
    wait_ready(sock.as_fd(), true, deadline, what)?;
    let iov = [IoSlice::new(bytes)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
    let sent = sendmsg::<()>(
        sock.as_raw_fd(),
        &iov,
        cmsgs,
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
        None,
    )
    .map_err(sys_err(what))?;
    if sent != bytes.len() {
        return Err(Error::InvalidArgument(format!("{what}: short send")));
    }
    Ok(())
}

/// Receives one message of at most `N` bytes and its fds.
fn recv_msg<const N: usize>(
    sock: &OwnedFd,
    deadline: Instant,
    what: &str,
) -> Result<(Vec<u8>, Vec<OwnedFd>)> {
    wait_ready(sock.as_fd(), false, deadline, what)?;
    let mut buf = [0u8; N];
    let mut cmsg_buf = nix::cmsg_space!([RawFd; MAX_LOCAL]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg_buf),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )
    .map_err(sys_err(what))?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().map_err(sys_err(what))? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for fd in raw {
                // SAFETY: the kernel installed `fd` in this process for this message; nothing
                // else owns it.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    let len = msg.bytes;
    let truncated = msg
        .flags
        .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
    if len == 0 && fds.is_empty() {
        return Err(Error::PeerLost {
            rank: u32::MAX,
            reason: format!("{what}: the local peer closed its socket"),
        });
    }
    if truncated {
        return Err(Error::InvalidArgument(format!(
            "{what}: message or descriptors truncated"
        )));
    }
    Ok((buf[..len].to_vec(), fds))
}

/// Checks the kernel-reported credentials of the process at the other end of `sock`.
fn check_peer(sock: &OwnedFd, expect: &RankInfo) -> Result<()> {
    let cred = getsockopt(sock, sockopt::PeerCredentials)
        .map_err(sys_err("reading a local peer's credentials (SO_PEERCRED)"))?;
    let uid = nix::unistd::getuid().as_raw();
    if cred.uid() != uid {
        return Err(Error::AuthFailed(format!(
            "a local socket claiming rank {} belongs to uid {}, not ours ({uid}); memory handles \
             are passed to same-uid processes only",
            expect.rank,
            cred.uid()
        )));
    }
    if u32::try_from(cred.pid()).ok() != Some(expect.pid) {
        return Err(Error::AuthFailed(format!(
            "a local socket claiming rank {} belongs to pid {}, but rank {} is pid {}",
            expect.rank,
            cred.pid(),
            expect.rank,
            expect.pid
        )));
    }
    Ok(())
}

/// One rank's connections to its local team, for fd exchanges.
#[derive(Debug)]
pub(crate) enum LocalLinks {
    /// A team of one: nothing to exchange.
    Alone,
    /// The leader: one socket per other local rank, in local-rank order.
    Leader(Vec<OwnedFd>),
    /// Another rank: the socket to the leader.
    Member(OwnedFd),
}

/// The leader's listening socket, until every member connected.
pub(crate) struct Listener {
    sock: OwnedFd,
    name: Vec<u8>,
}

impl Listener {
    /// Leader: listens on `symcomm/<random nonce>` in the abstract namespace.
    pub(crate) fn open(backlog: usize) -> Result<Self> {
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(|e| {
            Error::io(
                "drawing a socket name nonce",
                std::io::Error::other(e.to_string()),
            )
        })?;
        let name = format!("symcomm/{}", crate::bootstrap::hex_string(&nonce)).into_bytes();
        let sock = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(sys_err("creating the local handle-exchange socket"))?;
        let addr = UnixAddr::new_abstract(&name).map_err(sys_err("naming the local socket"))?;
        bind(sock.as_raw_fd(), &addr).map_err(sys_err("binding the local socket"))?;
        let backlog = Backlog::new(backlog.clamp(1, MAX_LOCAL) as i32)
            .map_err(sys_err("listening on the local socket"))?;
        listen(&sock, backlog).map_err(sys_err("listening on the local socket"))?;
        Ok(Listener { sock, name })
    }

    /// The abstract socket name (published through the control plane).
    pub(crate) fn name(&self) -> &[u8] {
        &self.name
    }
}

impl LocalLinks {
    /// Leader: accepts one connection from every other rank of `team` (global ranks, leader
    /// first), checks each one's credentials against `table`, and closes the listener.
    pub(crate) fn accept(
        listener: Listener,
        team: &[u32],
        table: &[RankInfo],
        deadline: Instant,
    ) -> Result<Self> {
        let mut socks: Vec<Option<OwnedFd>> = (0..team.len()).map(|_| None).collect();
        let mut joined = 1;
        while joined < team.len() {
            wait_ready(
                listener.sock.as_fd(),
                false,
                deadline,
                "waiting for the local ranks to connect",
            )?;
            let sock = match accept4(&listener.sock, SockFlag::SOCK_CLOEXEC) {
                Ok(s) => s,
                Err(Errno::EAGAIN | Errno::EINTR | Errno::ECONNABORTED) => continue,
                Err(e) => return Err(sys_err("accepting a local rank")(e)),
            };
            let (hello, _) = recv_msg::<4>(&sock, deadline, "reading a local rank's hello")?;
            let rank = <[u8; 4]>::try_from(hello.as_slice())
                .map(u32::from_be_bytes)
                .map_err(|_| Error::InvalidArgument("malformed local hello".into()))?;
            let Some(index) = team.iter().position(|&r| r == rank).filter(|&i| i > 0) else {
                tracing::warn!(target: "symcomm::init", "dropped a local connection claiming rank {rank}, not a member of this team");
                continue;
            };
            let Some(info) = table.get(rank as usize) else {
                continue;
            };
            if let Err(e) = check_peer(&sock, info) {
                tracing::warn!(target: "symcomm::init", "dropped a local connection: {e}");
                continue;
            }
            if socks[index].is_some() {
                tracing::warn!(target: "symcomm::init", "dropped a second local connection for rank {rank}");
                continue;
            }
            send_msg(&sock, &[1], &[], deadline, "acknowledging a local rank")?;
            socks[index] = Some(sock);
            joined += 1;
        }
        drop(listener);
        Ok(LocalLinks::Leader(
            socks.into_iter().skip(1).flatten().collect(),
        ))
    }

    /// Member: connects to the leader's socket `name`, checks that the listener is the leader's
    /// process, and introduces itself as `rank`.
    pub(crate) fn connect(
        name: &[u8],
        rank: u32,
        leader: &RankInfo,
        deadline: Instant,
    ) -> Result<Self> {
        let sock = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(sys_err("creating a local socket"))?;
        let addr = UnixAddr::new_abstract(name).map_err(sys_err("naming the local socket"))?;
        connect(sock.as_raw_fd(), &addr).map_err(sys_err(format!(
            "connecting to the local leader (rank {})",
            leader.rank
        )))?;
        check_peer(&sock, leader)?;
        send_msg(
            &sock,
            &rank.to_be_bytes(),
            &[],
            deadline,
            "greeting the local leader",
        )?;
        let (ack, _) = recv_msg::<1>(&sock, deadline, "waiting for the local leader's welcome")?;
        if ack != [1] {
            return Err(Error::InvalidArgument("malformed local welcome".into()));
        }
        Ok(LocalLinks::Member(sock))
    }

    /// Every local rank passes `mine`; returns every local rank's fd in local-rank order (this
    /// rank's own entry is a duplicate of `mine`). `seq` numbers the exchange; all local ranks
    /// call this in the same order.
    pub(crate) fn exchange(
        &self,
        seq: u64,
        mine: BorrowedFd<'_>,
        deadline: Instant,
    ) -> Result<Vec<OwnedFd>> {
        let dup = || {
            mine.try_clone_to_owned()
                .map_err(|source| Error::io("duplicating a memory handle", source))
        };
        let tag = seq.to_be_bytes();
        match self {
            LocalLinks::Alone => Ok(vec![dup()?]),
            LocalLinks::Leader(members) => {
                let mut all = vec![dup()?];
                for m in members {
                    let (bytes, mut fds) =
                        recv_msg::<8>(m, deadline, "receiving a local rank's memory handle")?;
                    if bytes != tag || fds.len() != 1 {
                        return Err(Error::InvalidArgument(format!(
                            "local handle exchange {seq}: unexpected message ({} bytes, {} fds)",
                            bytes.len(),
                            fds.len()
                        )));
                    }
                    all.append(&mut fds);
                }
                let raw: Vec<RawFd> = all.iter().map(AsRawFd::as_raw_fd).collect();
                for m in members {
                    send_msg(m, &tag, &raw, deadline, "sending the local memory handles")?;
                }
                Ok(all)
            }
            LocalLinks::Member(leader) => {
                send_msg(
                    leader,
                    &tag,
                    &[mine.as_raw_fd()],
                    deadline,
                    "sending our memory handle to the local leader",
                )?;
                let (bytes, fds) =
                    recv_msg::<8>(leader, deadline, "receiving the local memory handles")?;
                if bytes != tag {
                    return Err(Error::InvalidArgument(format!(
                        "local handle exchange {seq}: unexpected message"
                    )));
                }
                Ok(fds)
            }
        }
    }
}
