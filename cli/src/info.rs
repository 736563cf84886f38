//! `symcomm info`.

use std::fmt::Write as _;
use std::process::ExitCode;

use serde_json::{Value, json};
use symcomm::DEVICE_IMAGE;
use symcomm::tune::{self, BackendKind};
use symcomm::{DeviceImage, TUNABLES, UcxInfo, cuda};

pub(crate) fn run(as_json: bool) -> ExitCode {
    let cuda = cuda::probe();
    let nvrtc = cuda::nvrtc_version();
    let ucx = symcomm::ucx_probe();
    if as_json {
        println!(
            "{}",
            serde_json::to_string_pretty(&to_json(&DEVICE_IMAGE, &cuda, &nvrtc, &ucx))
                .unwrap_or_default()
        );
    } else {
        print!("{}", to_text(&DEVICE_IMAGE, &cuda, &nvrtc, &ucx));
    }
    ExitCode::SUCCESS
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// `bytes` in B, KiB, MiB or GiB (binary units), for people.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// `SYMCOMM_ALGO` as set (`None` when unset or empty).
fn symcomm_algo() -> Option<String> {
    std::env::var("SYMCOMM_ALGO").ok().filter(|v| !v.is_empty())
}

/// The SYMCOMM_ALGO line: its value and what it means, or why it is refused.
fn algo_text() -> String {
    let raw = symcomm_algo();
    match tune::parse_algo(raw.as_deref()) {
        Ok(Some(a)) => format!("{} (forced where available)", a.name()),
        Ok(None) => format!("{} (model choice)", raw.as_deref().unwrap_or("auto")),
        Err(e) => format!("error: {e}"),
    }
}

fn tuning_text(s: &mut String) {
    let _ = writeln!(
        s,
        "\nTuning (alpha-beta model; CUDA parameters from H200 measurements, emulator ones estimated):"
    );
    let _ = writeln!(
        s,
        "  time_us = launch + barriers x barrier + LL hops x hop + peer bytes / peer bw + local bytes / local bw"
    );
    let _ = writeln!(s, "  SYMCOMM_ALGO = {}", algo_text());
    let ranks: Vec<String> = REPORT_RANKS.iter().map(u32::to_string).collect();
    let _ = writeln!(
        s,
        "  {:<8} {:>9} {:>10} {:>7} {:>11} {:>12}   all-reduce LL up to | two-shot from ({} ranks)",
        "backend",
        "launch us",
        "barrier us",
        "hop us",
        "peer GB/s",
        "local GB/s",
        ranks.join(" / ")
    );
    let link = tune::HOST_LINK;
    let rails: Vec<String> = RAIL_HOSTS
        .iter()
        .map(|&h| tune::rail_two_shot_from(h).map_or_else(|| "never".to_owned(), human_bytes))
        .collect();
    let _ = writeln!(
        s,
        "  across hosts: {} us per exchange round, {} GB/s per rank; rail all-reduce two-shot from \
         (shard bytes, {} hosts) {}",
        link.round_us,
        link.gbps,
        RAIL_HOSTS.map(|h| h.to_string()).join(" / "),
        rails.join(" / ")
    );
    for b in BackendKind::ALL {
        let p = tune::params(b);
        let sizes = |f: fn(u32, BackendKind) -> Option<u64>| -> String {
            REPORT_RANKS
                .iter()
                .map(|&n| f(n, b).map_or_else(|| "never".to_owned(), human_bytes))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let _ = writeln!(
            s,
            "  {:<8} {:>9.1} {:>10.1} {:>7.1} {:>11.1} {:>12.1}   {} | {}",
            b.name(),
            p.launch_us,
            p.barrier_us,
            p.ll_hop_us,
            p.peer_read_gbps,
            p.local_gbps,
            sizes(tune::all_reduce_ll_limit),
            sizes(tune::all_reduce_crossover),
        );
        for (name, coll) in LL_REPORTED {
            let limits: Vec<String> = REPORT_RANKS
                .iter()
                .map(|&n| {
                    tune::ll_limit(coll, n, b).map_or_else(|| "never".to_owned(), human_bytes)
                })
                .collect();
            let _ = writeln!(
                s,
                "  {:<8} {:>53}   {name} LL up to {}",
                "",
                "",
                limits.join(" / ")
            );
        }
        let staged: Vec<String> = STAGED_REPORTED
            .iter()
            .map(|&(what, size, aligned)| {
                let up_to = tune::staged_in_kernel_up_to(size, aligned, b)
                    .map_or_else(|| "any size".to_owned(), human_bytes);
                format!("{what} {up_to}")
            })
            .collect();
        let _ = writeln!(
            s,
            "  {:<8} {:>53}   staged chunks copied in the kernel up to: {}",
            "",
            "",
            staged.join(" / ")
        );
    }
}

/// The buffers whose staged-copy limit `symcomm info` shows: (name, element size, aligned like
/// the staging windows).
const STAGED_REPORTED: [(&str, u64, bool); 3] = [
    ("aligned", 4, true),
    ("4-byte misaligned", 4, false),
    ("1-byte misaligned", 1, false),
];

fn tuning_json() -> Value {
    let raw = symcomm_algo();
    let algo = match tune::parse_algo(raw.as_deref()) {
        Ok(a) => json!({ "value": raw, "forced": a.map(tune::Algorithm::name), "error": null }),
        Err(e) => json!({ "value": raw, "forced": null, "error": e.to_string() }),
    };
    let mut t = model_report();
    if let Value::Object(m) = &mut t {
        m.insert("symcomm_algo".to_owned(), algo);
    }
    t
}

/// Host counts whose rail all-reduce crossover `symcomm info` shows.
const RAIL_HOSTS: [u32; 4] = [2, 3, 4, 8];

/// The collectives besides all-reduce with an LL algorithm, whose LL limits `symcomm info` shows.
const LL_REPORTED: [(&str, tune::Collective); 3] = [
    ("all-gather", tune::Collective::AllGather),
    ("reduce-scatter", tune::Collective::ReduceScatter),
    ("broadcast", tune::Collective::Broadcast),
];

/// The rank counts `symcomm info` shows all-reduce crossovers for.
const REPORT_RANKS: [u32; 3] = [2, 4, 8];

/// The model: the formula, both backends' parameters and their all-reduce crossovers for
/// [`REPORT_RANKS`] ranks: the largest LL size and the first two-shot size (`bytes` null: never).
fn model_report() -> Value {
    let backends: serde_json::Map<String, Value> = BackendKind::ALL
        .into_iter()
        .map(|b| {
            let p = tune::params(b);
            let cross: Vec<Value> = REPORT_RANKS
                .into_iter()
                .map(|n| json!({ "nranks": n, "bytes": tune::all_reduce_crossover(n, b) }))
                .collect();
            let ll: Vec<Value> = REPORT_RANKS
                .into_iter()
                .map(|n| json!({ "nranks": n, "bytes": tune::all_reduce_ll_limit(n, b) }))
                .collect();
            let ll_of = |c| -> Vec<Value> {
                REPORT_RANKS
                    .into_iter()
                    .map(|n| json!({ "nranks": n, "bytes": tune::ll_limit(c, n, b) }))
                    .collect()
            };
            let params = json!({
                "launch_us": p.launch_us,
                "barrier_us": p.barrier_us,
                "peer_read_gbps": p.peer_read_gbps,
                "local_gbps": p.local_gbps,
                "ll_hop_us": p.ll_hop_us,
                "ll_round_bytes": p.ll_round_bytes,
            });
            (
                b.name().to_owned(),
                json!({
                    "params": params,
                    "all_reduce_ll_up_to": ll,
                    "all_reduce_two_shot_from": cross,
                    "all_gather_ll_up_to": ll_of(tune::Collective::AllGather),
                    "reduce_scatter_ll_up_to": ll_of(tune::Collective::ReduceScatter),
                    "broadcast_ll_up_to": ll_of(tune::Collective::Broadcast),
                    "staged_in_kernel_up_to": STAGED_REPORTED
                        .iter()
                        .map(|&(what, size, aligned)| {
                            json!({
                                "buffers": what,
                                "elem_size": size,
                                "aligned": aligned,
                                "bytes": tune::staged_in_kernel_up_to(size, aligned, b),
                            })
                        })
                        .collect::<Vec<_>>(),
                }),
            )
        })
        .collect();
    let rails: Vec<Value> = RAIL_HOSTS
        .iter()
        .map(|&h| json!({ "hosts": h, "shard_bytes": tune::rail_two_shot_from(h) }))
        .collect();
    json!({
        "across_hosts": {
            "round_us": tune::HOST_LINK.round_us,
            "gbps": tune::HOST_LINK.gbps,
            "rail_all_reduce_two_shot_from": rails,
        },
        "model": "time_us = launch_us + barriers x barrier_us + ll_hops x ll_hop_us + peer_bytes / (1000 x peer_read_gbps) + local_bytes / (1000 x local_gbps)",
        "params_status": "CUDA: calibrated on an H200 (scripts/gpu-check, 2026-12-04); emulator: estimates",
        "backends": backends,
    })
}

/// How GPU data crosses hosts, from what UCX can do with device memory (`cuda_memory`) and
/// whether `SYMCOMM_HOSTS_STAGING=pinned` asks for staging (`asked`): `direct` or `staged`, and
/// the line `symcomm info` prints.
fn gpu_path(cuda_memory: bool, asked: bool) -> (&'static str, String) {
    let staged = |why: &str| {
        (
            "staged",
            format!(
                "staged through pinned host memory, in pieces overlapping PCIe and network ({why})"
            ),
        )
    };
    match (cuda_memory, asked) {
        (true, false) => (
            "direct",
            "direct: UCX moves CUDA memory itself (GPUDirect RDMA where the NIC and driver allow it, else UCX's own staging)".to_owned(),
        ),
        (true, true) => staged("SYMCOMM_HOSTS_STAGING=pinned; this UCX could move CUDA memory itself"),
        (false, _) => staged("this UCX was built without CUDA support, or found no driver"),
    }
}

/// Whether the environment asks for staging between hosts (`SYMCOMM_HOSTS_STAGING=pinned`; a
/// value that does not parse asks for nothing: communicators refuse it).
fn staging_asked() -> bool {
    symcomm::CommOptions::from_env().is_ok_and(|o| o.hosts_staging)
}

/// What kernels reach on other hosts' ranks (the device API across hosts), two lines.
const KERNELS_ACROSS_HOSTS: &str = "signal_set, signal_add, put_with_signal, barrier: through \
     a proxy thread per rank (ring in mapped pinned memory)\n             put, get, the device \
     collectives: within a host only";

/// The "Between hosts" section: the UCX library communicators spanning hosts use.
fn ucx_text(s: &mut String, ucx: &symcomm::Result<UcxInfo>) {
    let _ = writeln!(
        s,
        "\nBetween hosts (UCX; transports under the current UCX_* environment):"
    );
    match ucx {
        Ok(info) => {
            let _ = writeln!(s, "  ucx        {}", info.version);
            let _ = writeln!(s, "  transports {}", info.transports.join(", "));
            let _ = writeln!(
                s,
                "  GPU data   {}",
                gpu_path(info.cuda_memory, staging_asked()).1
            );
            let _ = writeln!(s, "  kernels    {KERNELS_ACROSS_HOSTS}");
        }
        Err(e) => {
            let _ = writeln!(
                s,
                "  ucx        unavailable: {e} (communicators spanning hosts need it)"
            );
        }
    }
}

fn ucx_json(ucx: &symcomm::Result<UcxInfo>) -> Value {
    match ucx {
        Ok(info) => json!({
            "available": true,
            "version": info.version,
            "transports": info.transports,
            "cuda_memory": info.cuda_memory,
            "gpu_data": gpu_path(info.cuda_memory, staging_asked()).0,
            "kernels": {
                "proxied": ["signal_set", "signal_add", "put_with_signal", "barrier"],
                "within_host": ["put", "get", "device collectives"],
                "proxy_slots": symcomm::abi::SYMCOMM_PROXY_SLOTS,
            },
        }),
        Err(e) => json!({ "available": false, "error": e.to_string() }),
    }
}

fn driver(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn to_text(
    image: &DeviceImage,
    cuda: &symcomm::Result<cuda::CudaInfo>,
    nvrtc: &symcomm::Result<(i32, i32)>,
    ucx: &symcomm::Result<UcxInfo>,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "symcomm {} (ABI {})",
        env!("CARGO_PKG_VERSION"),
        symcomm::abi::SYMCOMM_ABI_VERSION
    );
    let _ = writeln!(s, "\nDevice code `{}`:", image.name);
    match &image.compiler {
        Some(c) => {
            let _ = writeln!(
                s,
                "  built by   {} ({}; found via {})",
                c.nvcc, c.version, c.found_via
            );
            let _ = writeln!(
                s,
                "  images     SASS {}; PTX {} (ISA {})",
                image.sass_archs.join(", "),
                image.ptx_arch,
                image.ptx_isa.unwrap_or("?")
            );
        }
        None => {
            let _ = writeln!(s, "  built by   no nvcc ({})", image.no_compiler_reason);
            let _ = writeln!(
                s,
                "  images     none embedded: {} sources embedded, compiled with NVRTC at run time on a GPU",
                image.sources.len()
            );
        }
    }
    for m in image.modules {
        let names: Vec<&str> = m.kernels.iter().map(|k| k.name).collect();
        let size = m
            .fatbin
            .map(|f| format!("fatbin {} bytes", f.len()))
            .unwrap_or_else(|| "source only".into());
        let _ = writeln!(
            s,
            "  module     {} ({size}): {}",
            m.source,
            names.join(", ")
        );
    }
    if !image.report.is_empty() {
        let _ = writeln!(
            s,
            "  {:<40} {:<6} {:>5} {:>6} {:>12} {:>6} {:>6}",
            "kernel", "arch", "regs", "stack", "spill st/ld", "smem", "cmem"
        );
        for r in image.report {
            let _ = writeln!(
                s,
                "  {:<40} {:<6} {:>5} {:>6} {:>12} {:>6} {:>6}",
                r.kernel,
                r.arch,
                r.registers,
                r.stack_bytes,
                format!("{}/{}", r.spill_stores, r.spill_loads),
                r.shared_bytes,
                r.const_bytes
            );
        }
    }

    let _ = writeln!(s, "\nBackends:");
    match cuda {
        Ok(info) => {
            let _ = writeln!(
                s,
                "  cuda       driver {}, {} GPU(s)",
                driver(info.driver_version),
                info.devices.len()
            );
            for d in &info.devices {
                let _ = writeln!(
                    s,
                    "    GPU {}: {}, {} SMs, {:.1} GiB, compute capability {}.{}",
                    d.ordinal,
                    d.name,
                    d.sms,
                    gib(d.memory_bytes),
                    d.compute_capability.0,
                    d.compute_capability.1
                );
            }
            if info.devices.len() > 1 {
                let _ = writeln!(s, "    peer access (row can access column):");
                let header: String = (0..info.devices.len()).map(|j| format!("{j:>3}")).collect();
                let _ = writeln!(s, "         {header}");
                for (i, row) in info.peer_access.iter().enumerate() {
                    let cells: String = row
                        .iter()
                        .map(|&ok| format!("{:>3}", if ok { "Y" } else { "." }))
                        .collect();
                    let _ = writeln!(s, "      {i:>3}{cells}");
                }
            }
        }
        Err(e) => {
            let _ = writeln!(s, "  cuda       unavailable: {e}");
        }
    }
    match nvrtc {
        Ok((major, minor)) => {
            let _ = writeln!(
                s,
                "  nvrtc      {major}.{minor} (run-time compilation of the embedded sources)"
            );
        }
        Err(e) => {
            let _ = writeln!(s, "  nvrtc      unavailable: {e}");
        }
    }
    let _ = writeln!(
        s,
        "  emulator   available (CPU threads; up to {} threads per launch)",
        symcomm_device::emu::MAX_THREADS
    );

    ucx_text(&mut s, ucx);

    let _ = writeln!(s, "\nTunables:");
    for t in TUNABLES {
        let shown = t
            .value()
            .unwrap_or_else(|| format!("{} (default)", t.default));
        let _ = writeln!(s, "  {:<22} = {:<32} {}", t.name, shown, t.help);
    }
    tuning_text(&mut s);
    s
}

fn to_json(
    image: &DeviceImage,
    cuda: &symcomm::Result<cuda::CudaInfo>,
    nvrtc: &symcomm::Result<(i32, i32)>,
    ucx: &symcomm::Result<UcxInfo>,
) -> Value {
    let modules: Vec<Value> = image
        .modules
        .iter()
        .map(|m| {
            json!({
                "source": m.source,
                "fatbin_bytes": m.fatbin.map(<[u8]>::len),
                "kernels": m.kernels.iter().map(|k| k.name).collect::<Vec<_>>(),
            })
        })
        .collect();
    let report: Vec<Value> = image
        .report
        .iter()
        .map(|r| {
            json!({
                "kernel": r.kernel, "arch": r.arch, "registers": r.registers, "stack_bytes": r.stack_bytes,
                "spill_stores": r.spill_stores, "spill_loads": r.spill_loads,
                "shared_bytes": r.shared_bytes, "const_bytes": r.const_bytes,
            })
        })
        .collect();
    let cuda = match cuda {
        Ok(info) => json!({
            "available": true,
            "driver_version": info.driver_version,
            "devices": info.devices.iter().map(|d| json!({
                "ordinal": d.ordinal, "name": d.name, "sms": d.sms, "memory_bytes": d.memory_bytes,
                "compute_capability": format!("{}.{}", d.compute_capability.0, d.compute_capability.1),
            })).collect::<Vec<_>>(),
            "peer_access": info.peer_access,
        }),
        Err(e) => json!({ "available": false, "error": e.to_string() }),
    };
    let nvrtc = match nvrtc {
        Ok((major, minor)) => json!({ "available": true, "version": format!("{major}.{minor}") }),
        Err(e) => json!({ "available": false, "error": e.to_string() }),
    };
    let tunables: Vec<Value> = TUNABLES
        .iter()
        .map(
            |t| json!({ "name": t.name, "value": t.value(), "default": t.default, "help": t.help }),
        )
        .collect();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "abi_version": symcomm::abi::SYMCOMM_ABI_VERSION,
        "device_code": {
            "name": image.name,
            "nvcc": image.compiler.map(|c| json!({ "path": c.nvcc, "version": c.version, "found_via": c.found_via })),
            "no_nvcc_reason": (!image.no_compiler_reason.is_empty()).then_some(image.no_compiler_reason),
            "sass": if image.compiler.is_some() { image.sass_archs.to_vec() } else { Vec::new() },
            "ptx": image.compiler.map(|_| image.ptx_arch),
            "ptx_isa": image.ptx_isa,
            "sources_embedded": image.sources.len(),
            "modules": modules,
            "ptxas": report,
        },
        "backends": {
            "cuda": cuda,
            "nvrtc": nvrtc,
            "emulator": { "available": true, "max_threads_per_launch": symcomm_device::emu::MAX_THREADS },
        },
        "between_hosts": ucx_json(ucx),
        "tunables": tunables,
        "tuning": tuning_json(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn between_hosts_says_how_gpu_data_moves() {
        let info = UcxInfo {
            version: "1.13.1".into(),
            transports: vec!["tcp/lo".into(), "posix/memory".into()],
            cuda_memory: false,
        };
        let mut s = String::new();
        ucx_text(&mut s, &Ok(info.clone()));
        assert!(s.contains("ucx        1.13.1"), "{s}");
        assert!(s.contains("transports tcp/lo, posix/memory"), "{s}");
        assert!(s.contains("built without CUDA"), "{s}");
        assert_eq!(gpu_path(true, false).0, "direct");
        assert!(gpu_path(true, false).1.contains("GPUDirect RDMA"));
        assert_eq!(gpu_path(true, true).0, "staged");
        assert!(
            gpu_path(true, true)
                .1
                .contains("SYMCOMM_HOSTS_STAGING=pinned")
        );
        assert_eq!(gpu_path(false, false).0, "staged");
        assert!(
            s.contains("kernels    signal_set, signal_add, put_with_signal"),
            "{s}"
        );
        let j = ucx_json(&Ok(UcxInfo {
            cuda_memory: true,
            ..info
        }));
        assert_eq!(j["cuda_memory"], json!(true));
        assert_eq!(j["transports"][1], json!("posix/memory"));
        assert_eq!(j["kernels"]["proxied"][2], json!("put_with_signal"));
        assert_eq!(j["kernels"]["proxy_slots"], json!(64));
        let missing = Err(symcomm::Error::Unsupported("no libucp".into()));
        let mut s = String::new();
        ucx_text(&mut s, &missing);
        assert!(
            s.contains("unavailable: ") && s.contains("no libucp"),
            "{s}"
        );
        assert_eq!(ucx_json(&missing)["available"], json!(false));
    }

    #[test]
    fn report_has_both_backends() {
        let r = model_report();
        let rails = r["across_hosts"]["rail_all_reduce_two_shot_from"]
            .as_array()
            .unwrap();
        for (v, h) in rails.iter().zip(RAIL_HOSTS) {
            assert_eq!(v["shard_bytes"], json!(tune::rail_two_shot_from(h)));
        }
        for b in BackendKind::ALL {
            let be = &r["backends"][b.name()];
            assert_eq!(be["params"]["launch_us"], json!(tune::params(b).launch_us));
            assert_eq!(
                be["params"]["local_gbps"],
                json!(tune::params(b).local_gbps)
            );
            let x = be["all_reduce_two_shot_from"].as_array().unwrap();
            assert_eq!(x.len(), REPORT_RANKS.len());
            for (v, n) in x.iter().zip(REPORT_RANKS) {
                assert_eq!(v["nranks"], json!(n));
                assert_eq!(v["bytes"], json!(tune::all_reduce_crossover(n, b)));
            }
            let ag = be["all_gather_ll_up_to"].as_array().unwrap();
            for (v, n) in ag.iter().zip(REPORT_RANKS) {
                assert_eq!(v["bytes"], json!(tune::all_gather_ll_limit(n, b)));
            }
            for (key, c) in [
                ("reduce_scatter_ll_up_to", tune::Collective::ReduceScatter),
                ("broadcast_ll_up_to", tune::Collective::Broadcast),
            ] {
                let v = be[key].as_array().unwrap();
                assert_eq!(v.len(), REPORT_RANKS.len(), "{key}");
                for (v, n) in v.iter().zip(REPORT_RANKS) {
                    assert_eq!(v["bytes"], json!(tune::ll_limit(c, n, b)), "{key}");
                }
            }
            let ll = be["all_reduce_ll_up_to"].as_array().unwrap();
            for (v, n) in ll.iter().zip(REPORT_RANKS) {
                assert_eq!(v["bytes"], json!(tune::all_reduce_ll_limit(n, b)));
                assert_eq!(
                    v["bytes"].is_u64(),
                    b == BackendKind::Cuda,
                    "{b:?} n={n}: LL wins small messages on GPUs only"
                );
            }
            let staged = be["staged_in_kernel_up_to"].as_array().unwrap();
            assert_eq!(staged.len(), STAGED_REPORTED.len());
            for (v, (_, size, aligned)) in staged.iter().zip(STAGED_REPORTED) {
                assert_eq!(
                    v["bytes"],
                    json!(tune::staged_in_kernel_up_to(size, aligned, b)),
                    "{b:?} {size} {aligned}"
                );
            }
            // Aligned chunks: the kernel's copies at any size on GPUs, not on the emulator.
            assert_eq!(staged[0]["bytes"].is_null(), b == BackendKind::Cuda);
        }
    }
}
