//! Two "hosts" with separate IP stacks on one machine, for `cli/tests/hosts.rs` and
//! `cli/benches/hosts.rs`: two network namespaces joined by a veth pair (10.77.0.1/24 and
//! 10.77.0.2/24), and ranks of `symcomm perf` started inside them with the launcher variables,
//! their host's id, and UCX restricted to TCP over the veth device (no shared memory between the
//! "hosts": their traffic crosses the link, which a test can take down).
//!
//! Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and `ip` (iproute2); without them
//! [`Net::new`] fails, saying what is missing. The namespaces' names carry this process's id, so
//! concurrent runs do not collide; dropping the [`Net`] deletes them (and the veth pair with them).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Child, Command, Stdio};

use symcomm::UniqueId;

/// The rendezvous port of rank 0 in the first namespace (fresh namespaces: nothing else binds).
const ROOT_PORT: u16 = 29500;

/// Two network namespaces joined by a veth pair; host `h` is namespace `ns[h]`.
pub(crate) struct Net {
    pub(crate) ns: [String; 2],
    pub(crate) dev: [String; 2],
    pub(crate) addr: [&'static str; 2],
}

/// Runs `ip ARGS`; its stderr on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip` (iproute2; scripts/test installs it): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Net {
    /// Creates the namespaces, the veth pair between them, their addresses, and brings every
    /// link up (loopback too).
    pub(crate) fn new() -> Result<Net, String> {
        let pid = std::process::id();
        let net = Net {
            ns: [format!("symcomm{pid}a"), format!("symcomm{pid}b")],
            dev: [format!("sc{pid}a"), format!("sc{pid}b")],
            addr: ["10.77.0.1", "10.77.0.2"],
        };
        let setup = || -> Result<(), String> {
            for ns in &net.ns {
                ip(&["netns", "add", ns])?;
            }
            ip(&[
                "link",
                "add",
                &net.dev[0],
                "type",
                "veth",
                "peer",
                "name",
                &net.dev[1],
            ])?;
            for h in 0..2 {
                let (ns, dev) = (net.ns[h].as_str(), net.dev[h].as_str());
                ip(&["link", "set", dev, "netns", ns])?;
                let cidr = format!("{}/24", net.addr[h]);
                ip(&["-n", ns, "addr", "add", &cidr, "dev", dev])?;
                ip(&["-n", ns, "link", "set", "lo", "up"])?;
                ip(&["-n", ns, "link", "set", dev, "up"])?;
            }
            Ok(())
        };
        setup().map_err(|e| {
            format!(
                "cannot create two network namespaces joined by a veth pair (needs root: \
                 CAP_SYS_ADMIN and CAP_NET_ADMIN, and iproute2): {e}"
            )
        })?;
        Ok(net)
    }

    /// `program` run inside host `h`'s namespace.
    pub(crate) fn command(&self, h: usize, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns[h], program]);
        cmd
    }

    /// Takes the link down (from host 1's side) or up again.
    pub(crate) fn set_link(&self, up: bool) -> Result<(), String> {
        let state = if up { "up" } else { "down" };
        ip(&["-n", &self.ns[1], "link", "set", &self.dev[1], state])
    }

    /// What every rank on host `h` gets: its host's id, its network device for the bootstrap and
    /// for UCX (TCP only), the emulator, and a longer init timeout (ranks start one by one).
    pub(crate) fn host_env(&self, h: usize) -> Vec<(&'static str, String)> {
        vec![
            ("SYMCOMM_HOST_ID", format!("netns-host-{h}")),
            ("SYMCOMM_SOCKET_IFNAME", self.dev[h].clone()),
            ("SYMCOMM_DEVICE", "emu".to_owned()),
            ("SYMCOMM_INIT_TIMEOUT", "60s".to_owned()),
            ("UCX_TLS", "tcp".to_owned()),
            ("UCX_NET_DEVICES", self.dev[h].clone()),
        ]
    }

    /// A fresh job id whose root is rank 0 on host 0 (it must be there).
    pub(crate) fn job_id(&self) -> String {
        let root = format!("{}:{ROOT_PORT}", self.addr[0]).parse().unwrap();
        UniqueId::from_parts(root, UniqueId::random_secret().unwrap())
            .unwrap()
            .to_string()
    }

    /// The ranks of one `symcomm perf ARGS…` job, rank `r` on host `hosts[r]` (0 or 1; rank 0
    /// on host 0), on the emulator, with UCX over TCP on the veth device and `env` on top; each
    /// rank's stdout and stderr piped.
    pub(crate) fn spawn_perf(
        &self,
        symcomm: &str,
        hosts: &[usize],
        args: &[&str],
        env: &[(&str, String)],
    ) -> Vec<Child> {
        assert_eq!(
            hosts.first(),
            Some(&0),
            "rank 0 (the root) must be on host 0"
        );
        let id = self.job_id();
        let n = hosts.len();
        (0..n)
            .map(|r| {
                let h = hosts[r];
                let local: Vec<usize> = (0..n).filter(|&q| hosts[q] == h).collect();
                let local_rank = local.iter().position(|&q| q == r).unwrap();
                let mut cmd = self.command(h, symcomm);
                cmd.arg("perf")
                    .args(args)
                    .env("SYMCOMM_ID", &id)
                    .env("RANK", r.to_string())
                    .env("WORLD_SIZE", n.to_string())
                    .env("LOCAL_RANK", local_rank.to_string())
                    .env("LOCAL_WORLD_SIZE", local.len().to_string())
                    .envs(self.host_env(h))
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                for (k, v) in env {
                    cmd.env(k, v);
                }
                cmd.spawn().unwrap()
            })
            .collect()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and so the pair.
        for ns in &self.ns {
            let _ = ip(&["netns", "delete", ns]);
        }
    }
}
