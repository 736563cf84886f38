//! Interfaces, addresses, host identity, and sockets: the root's listener and the ranks'
//! connections, each bound narrowly and bounded in time.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use nix::ifaddrs::getifaddrs;
use nix::net::if_::InterfaceFlags;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::wire::remaining;
use crate::{Error, Result};

/// One address of one network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Iface {
    pub(crate) name: String,
    pub(crate) addr: IpAddr,
    pub(crate) up: bool,
    pub(crate) loopback: bool,
}

/// Every IPv4/IPv6 address of this machine's interfaces (`getifaddrs`).
pub(crate) fn interfaces() -> Result<Vec<Iface>> {
    let list = getifaddrs().map_err(|e| {
        Error::io(
            "listing network interfaces (getifaddrs)",
            io::Error::from(e),
        )
    })?;
    let mut out = Vec::new();
    for ifa in list {
        let Some(storage) = ifa.address else { continue };
        let addr = if let Some(v4) = storage.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = storage.as_sockaddr_in6() {
            IpAddr::V6(v6.ip())
        } else {
            continue;
        };
        out.push(Iface {
            name: ifa.interface_name,
            addr,
            up: ifa.flags.contains(InterfaceFlags::IFF_UP),
            loopback: ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK) || addr.is_loopback(),
        });
    }
    Ok(out)
}

/// Whether a v6 address needs a scope id to be used (link-local `fe80::/10`); such addresses are
/// skipped, since a `SocketAddr` string does not carry the scope portably.
fn link_local_v6(addr: &IpAddr) -> bool {
    matches!(addr, IpAddr::V6(a) if (a.segments()[0] & 0xffc0) == 0xfe80)
}

/// The address of the interface `spec` names: an exact name, else the first interface whose name
/// starts with `spec` (`eth` → `eth0`). IPv4 is preferred over IPv6.
pub(crate) fn ifname_addr(spec: &str, ifaces: &[Iface]) -> Result<IpAddr> {
    let spec = spec.trim();
    let usable = |i: &Iface| i.up && !link_local_v6(&i.addr);
    let exact: Vec<&Iface> = ifaces.iter().filter(|i| i.name == spec).collect();
    let candidates: Vec<&Iface> = if exact.is_empty() {
        ifaces.iter().filter(|i| i.name.starts_with(spec)).collect()
    } else {
        exact
    };
    let pick = candidates
        .iter()
        .find(|i| usable(i) && i.addr.is_ipv4())
        .or_else(|| candidates.iter().find(|i| usable(i)));
    match pick {
        Some(i) => Ok(i.addr),
        None => {
            let mut names: Vec<&str> = ifaces.iter().map(|i| i.name.as_str()).collect();
            names.dedup();
            Err(Error::InvalidArgument(format!(
                "SYMCOMM_SOCKET_IFNAME={spec}: no interface of that name (or prefix) with a usable \
                 address is up; interfaces: {}",
                names.join(", ")
            )))
        }
    }
}

/// Interfaces that are seldom the path to other hosts.
fn virtual_iface(name: &str) -> bool {
    ["docker", "veth", "virbr", "br-", "cni", "flannel"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// The root's address without an interface named: an up, non-loopback IPv4 address (real
/// interfaces before container bridges), else a global IPv6 one, else `127.0.0.1`.
pub(crate) fn choose_default(ifaces: &[Iface]) -> IpAddr {
    let candidates = || ifaces.iter().filter(|i| i.up && !i.loopback);
    candidates()
        .find(|i| i.addr.is_ipv4() && !virtual_iface(&i.name))
        .or_else(|| candidates().find(|i| i.addr.is_ipv4()))
        .or_else(|| candidates().find(|i| i.addr.is_ipv6() && !link_local_v6(&i.addr)))
        .map(|i| i.addr)
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// The address the root binds when it chooses: `ifname`'s, else [`choose_default`].
pub(crate) fn default_root_ip(ifname: Option<&str>) -> Result<IpAddr> {
    let ifaces = interfaces()?;
    match ifname.filter(|s| !s.trim().is_empty()) {
        Some(spec) => ifname_addr(spec, &ifaces),
        None => Ok(choose_default(&ifaces)),
    }
}

/// This machine's host name (the first part of [`host_identity`]).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// This machine's identity for local teams: `<hostname>/<boot id>` (the kernel's boot id: ranks
/// that share it share a kernel, hence GPU memory handles), falling back to `/etc/machine-id`,
/// then the host name alone.
pub fn host_identity() -> String {
    let host = hostname();
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    let id = read("/proc/sys/kernel/random/boot_id").or_else(|| read("/etc/machine-id"));
    let full = match id {
        Some(id) => format!("{host}/{id}"),
        None => host,
    };
    // Host names are at most 64 bytes and boot ids 36: this cut never happens in practice.
    full.chars().take(super::wire::MAX_HOST_ID).collect()
}

/// A port on `ip` that is free now, for a root that another process will bind (a launcher's
/// rank 0, a test's): chosen at random below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), so that no port the kernel hands out by itself —
/// to an outgoing connection or a bind to port 0 — can take it before rank 0 binds it. Only a
/// program binding that very port in between still can; rank 0 then reports the port in use.
/// Falls back to an ephemeral port where the range leaves no room below it.
///
/// # Errors
/// [`Error::Io`] when no port on `ip` can be bound at all or the CSPRNG fails.
pub fn free_port(ip: IpAddr) -> Result<u16> {
    let low = ephemeral_floor();
    if low >= FREE_PORT_FLOOR + 1024 {
        let mut seed = [0u8; 8];
        super::auth::fill_random(&mut seed)?;
        let mut x = u64::from_le_bytes(seed) | 1;
        for _ in 0..64 {
            // xorshift64: a few dozen tries need no better generator.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let port = FREE_PORT_FLOOR + (x % u64::from(low - FREE_PORT_FLOOR)) as u16;
            if try_bind(SocketAddr::new(ip, port)).is_ok() {
                return Ok(port);
            }
        }
    }
    try_bind(SocketAddr::new(ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|source| Error::io(format!("finding a free port on {ip}"), source))
}

/// [`free_port`] draws from `FREE_PORT_FLOOR..` the ephemeral range's start (well above the ports
/// services commonly use).
const FREE_PORT_FLOOR: u16 = 20_000;

/// The first port of the kernel's ephemeral range (Linux's default 32768 when unreadable).
fn ephemeral_floor() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Binds the root's listener on `addr` (`SO_REUSEADDR`, so a fixed port in `TIME_WAIT` from a
/// previous run binds), retrying `EADDRINUSE` for up to `retry_for`.
pub(crate) fn bind_listener(addr: SocketAddr, retry_for: Duration) -> Result<TcpListener> {
    let until = Instant::now() + retry_for;
    let mut backoff = Duration::from_millis(20);
    loop {
        match try_bind(addr) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < until => {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(250));
            }
            Err(source) => {
                let hint = match source.kind() {
                    io::ErrorKind::AddrInUse => {
                        " (port in use: pick another port with SYMCOMM_PORT or use a fresh UniqueId)"
                    }
                    io::ErrorKind::AddrNotAvailable => {
                        " (not an address of this machine: rank 0 must run where the root address points)"
                    }
                    _ => "",
                };
                return Err(Error::io(
                    format!("binding the bootstrap root listener on {addr}{hint}"),
                    source,
                ));
            }
        }
    }
}

fn try_bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.bind(&SockAddr::from(addr))?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// Why connecting to the root failed.
#[derive(Debug)]
pub(crate) enum ConnectError {
    /// The deadline passed while the root was unreachable (the last error, if any).
    Deadline(Option<io::Error>),
    /// A local problem that retrying will not fix.
    Fatal(Error),
}

/// Connects to `root` before `deadline`, from `bind_ip` when given (else the kernel picks the
/// source address that routes to the root). Refused / unreachable / reset connections are
/// retried with backoff — the root may not be listening yet.
pub(crate) fn connect(
    root: SocketAddr,
    bind_ip: Option<IpAddr>,
    deadline: Instant,
) -> std::result::Result<TcpStream, ConnectError> {
    let mut backoff = Duration::from_millis(5);
    let mut last = None;
    loop {
        let Some(left) = remaining(deadline) else {
            return Err(ConnectError::Deadline(last));
        };
        match try_connect(root, bind_ip, left.min(Duration::from_secs(5))) {
            Ok(s) => return Ok(s),
            Err(e) if retryable(&e) => {
                last = Some(e);
                let Some(left) = remaining(deadline) else {
                    return Err(ConnectError::Deadline(last));
                };
                std::thread::sleep(backoff.min(left));
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
            Err(source) => {
                let what = match bind_ip {
                    Some(ip) => format!("connecting from {ip} to the bootstrap root at {root}"),
                    None => format!("connecting to the bootstrap root at {root}"),
                };
                return Err(ConnectError::Fatal(Error::io(what, source)));
            }
        }
    }
}

fn retryable(e: &io::Error) -> bool {
    use io::ErrorKind as K;
    matches!(
        e.kind(),
        K::ConnectionRefused
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::TimedOut
            | K::WouldBlock
            | K::Interrupted
            | K::HostUnreachable
            | K::NetworkUnreachable
            | K::NetworkDown
    )
}

fn try_connect(
    root: SocketAddr,
    bind_ip: Option<IpAddr>,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(root), Type::STREAM, Some(Protocol::TCP))?;
    if let Some(ip) = bind_ip {
        socket.bind(&SockAddr::from(SocketAddr::new(ip, 0)))?;
    }
    socket.connect_timeout(&SockAddr::from(root), timeout)?;
    let stream: TcpStream = socket.into();
    stream.set_nodelay(true)?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    fn iface(name: &str, addr: &str, up: bool) -> Iface {
        let addr: IpAddr = addr.parse().unwrap();
        Iface {
            name: name.into(),
            addr,
            up,
            loopback: addr.is_loopback(),
        }
    }

    #[test]
    fn default_prefers_real_ipv4_then_bridges_then_v6_then_loopback() {
        let lo = iface("lo", "127.0.0.1", true);
        let docker = iface("docker0", "172.17.0.1", true);
        let eth = iface("eth0", "10.0.0.5", true);
        let down = iface("eth1", "10.0.1.5", false);
        let v6ll = iface("eth0", "fe80::1", true);
        let v6 = iface("eth0", "fd00::5", true);
        assert_eq!(
            choose_default(&[lo.clone(), docker.clone(), down.clone(), eth.clone()]),
            eth.addr
        );
        assert_eq!(choose_default(&[lo.clone(), docker.clone()]), docker.addr);
        assert_eq!(
            choose_default(&[lo.clone(), v6ll.clone(), v6.clone()]),
            v6.addr
        );
        assert_eq!(
            choose_default(&[lo.clone(), down, v6ll]),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert_eq!(choose_default(&[]), IpAddr::V4(Ipv4Addr::LOCALHOST));
    }

    #[test]
    fn ifname_matches_exactly_then_by_prefix_and_names_the_choices() {
        let list = [
            iface("lo", "127.0.0.1", true),
            iface("eth0", "fd00::5", true),
            iface("eth0", "10.0.0.5", true),
            iface("eth10", "10.0.10.5", true),
            iface("ib0", "192.168.1.5", false),
        ];
        assert_eq!(
            ifname_addr("eth0", &list).unwrap(),
            "10.0.0.5".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            ifname_addr("eth1", &list).unwrap(),
            "10.0.10.5".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            ifname_addr("lo", &list).unwrap(),
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        let err = ifname_addr("ib", &list).unwrap_err().to_string();
        assert!(
            err.contains("SYMCOMM_SOCKET_IFNAME=ib") && err.contains("eth10"),
            "{err}"
        );
        assert!(ifname_addr("wlan", &list).is_err());
    }

    #[test]
    fn this_machine_has_interfaces_and_an_identity() {
        let list = interfaces().unwrap();
        assert!(list.iter().any(|i| i.loopback), "{list:?}");
        assert!(!host_identity().is_empty());
        assert_eq!(host_identity(), host_identity());
        let ip = default_root_ip(None).unwrap();
        assert!(!ip.is_unspecified());
        assert_eq!(
            default_root_ip(Some("lo")).unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
    }

    #[test]
    fn connect_gives_up_at_the_deadline_when_nobody_listens() {
        // A port that was free a moment ago.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let t = Instant::now();
        let r = connect(port, None, t + Duration::from_millis(200));
        assert!(matches!(r, Err(ConnectError::Deadline(Some(_)))), "{r:?}");
        assert!(t.elapsed() < Duration::from_millis(600));
    }

    #[test]
    fn free_ports_are_bindable_and_outside_the_ephemeral_range() {
        let low = ephemeral_floor();
        assert!(
            low > FREE_PORT_FLOOR + 1024,
            "this machine's range starts at {low}"
        );
        for _ in 0..20 {
            let port = free_port(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
            assert!((FREE_PORT_FLOOR..low).contains(&port), "{port}");
            assert!(
                bind_listener(
                    SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                    Duration::ZERO
                )
                .is_ok()
            );
        }
    }

    #[test]
    fn listeners_bind_fixed_ports_and_report_conflicts() {
        let l = bind_listener("127.0.0.1:0".parse().unwrap(), Duration::ZERO).unwrap();
        let addr = l.local_addr().unwrap();
        let err = bind_listener(addr, Duration::from_millis(50))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&addr.to_string()) && err.contains("in use"),
            "{err}"
        );
        drop(l);
        assert!(bind_listener(addr, Duration::from_millis(500)).is_ok());
    }
}
