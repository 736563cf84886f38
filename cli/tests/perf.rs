//! `symcomm perf` as a user runs it, on the emulator: the nccl-tests table parsed (header,
//! every row's columns, sizes and counts as nccl-tests computes them, `#wrong` 0, the footer),
//! every collective out of place and in place, ordinary device buffers, every type and op of
//! all-reduce, checks off (`N/A`), `--json`, bad arguments (exit 2), and ranks as processes
//! under `symcomm launch` (rank 0's table, prefixed `[0]`).
//!
//! Small sweeps with few iterations keep the file at a few tens of seconds on two cores.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output, Stdio};

const SYMCOMM: &str = env!("CARGO_BIN_EXE_symcomm");

/// `symcomm ARGS…` outside any launcher, with quiet logs.
fn symcomm(args: &[&str]) -> Output {
    Command::new(SYMCOMM)
        .args(args)
        .stdin(Stdio::null())
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("SYMCOMM_ID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("PMI_RANK")
        .env_remove("SYMCOMM_ALGO")
        .env("SYMCOMM_LOG", "error")
        .output()
        .unwrap()
}

/// `symcomm perf COLL FLAGS --device emu`, FLAGS split at white space.
fn perf_emu(coll: &str, flags: &str) -> Output {
    let mut args = vec!["perf", coll];
    args.extend(flags.split_whitespace());
    args.extend(["--device", "emu"]);
    symcomm(&args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Fails with both streams shown unless the run exited 0.
fn ok(out: &Output, what: &str) -> String {
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        text(&out.stderr)
    );
    stdout
}

/// One table row, split into its columns.
#[derive(Debug)]
struct Row {
    size: u64,
    count: u64,
    dtype: String,
    redop: String,
    root: i64,
    /// (time, algbw, busbw, #wrong) out of place, then in place; #wrong `None` for `N/A`.
    groups: [(f64, f64, f64, Option<u64>); 2],
    algo: String,
}

#[derive(Debug)]
struct Table {
    comments: Vec<String>,
    rows: Vec<Row>,
    out_of_bounds: String,
    avg_busbw: f64,
}

fn num<T: std::str::FromStr>(s: &str, line: &str) -> T {
    s.parse()
        .unwrap_or_else(|_| panic!("`{s}` is not a number in row {line:?}"))
}

/// Parses nccl-tests output (lines optionally prefixed by `prefix`).
fn parse(stdout: &str, prefix: &str) -> Table {
    let mut comments = Vec::new();
    let mut rows = Vec::new();
    for line in stdout.lines() {
        let line = line
            .strip_prefix(prefix)
            .unwrap_or_else(|| panic!("line without {prefix:?}: {line:?}"));
        if line.starts_with('#') {
            comments.push(line.to_owned());
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 14, "13 nccl-tests columns + algo: {line:?}");
        let wrong = |s: &str| (s != "N/A").then(|| num::<u64>(s, line));
        rows.push(Row {
            size: num(f[0], line),
            count: num(f[1], line),
            dtype: f[2].to_owned(),
            redop: f[3].to_owned(),
            root: num(f[4], line),
            groups: [
                (
                    num(f[5], line),
                    num(f[6], line),
                    num(f[7], line),
                    wrong(f[8]),
                ),
                (
                    num(f[9], line),
                    num(f[10], line),
                    num(f[11], line),
                    wrong(f[12]),
                ),
            ],
            algo: f[13].to_owned(),
        });
    }
    let value = |key: &str| {
        comments
            .iter()
            .find_map(|c| c.strip_prefix(key))
            .unwrap_or_else(|| panic!("no `{key}` line in {comments:#?}"))
            .trim()
            .to_owned()
    };
    let out_of_bounds = value("# Out of bounds values : ");
    let avg_busbw = num(&value("# Avg bus bandwidth    : "), "footer");
    Table {
        comments,
        rows,
        out_of_bounds,
        avg_busbw,
    }
}

/// nccl-tests' (size, count) for a requested size: per-rank-block collectives round down to
/// whole blocks of `nranks` elements.
fn expected_shape(coll: &str, size: u64, tsize: u64, nranks: u64) -> (u64, u64) {
    let elems = size / tsize;
    match coll {
        "all_gather" | "reduce_scatter" | "scatter" | "all_to_all" => {
            let count = elems / nranks;
            (count * nranks * tsize, count)
        }
        _ => (elems * tsize, elems),
    }
}

fn bus_factor(coll: &str, n: f64) -> f64 {
    match coll {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "broadcast" | "reduce" | "sendrecv" => 1.0,
        _ => (n - 1.0) / n,
    }
}

/// The checks every table must pass: header, sizes, columns, #wrong, footer.
fn check_table(t: &Table, coll: &str, sizes: &[u64], nranks: u64, redop: &str, root: i64) {
    assert!(
        t.comments
            .iter()
            .any(|c| c.split_whitespace().collect::<Vec<_>>()
                == [
                    "#", "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
                    "#wrong", "time", "algbw", "busbw", "#wrong", "algo"
                ]),
        "no column header in {:#?}",
        t.comments
    );
    assert!(
        t.comments
            .iter()
            .any(|c| c.contains("out-of-place") && c.contains("in-place"))
    );
    assert_eq!(t.rows.len(), sizes.len(), "{:#?}", t.rows);
    let mut bw = Vec::new();
    for (row, &s) in t.rows.iter().zip(sizes) {
        assert_eq!(
            (row.size, row.count),
            expected_shape(coll, s, 4, nranks),
            "{row:?}"
        );
        assert_eq!(row.dtype, "float");
        assert_eq!(row.redop, redop);
        assert_eq!(row.root, root);
        assert!(!row.algo.is_empty());
        for (time, algbw, busbw, wrong) in row.groups {
            assert_eq!(wrong, Some(0), "{coll}: {row:?}");
            assert!(time > 0.0, "{row:?}");
            // Columns are printed with 2 decimals.
            let want = row.size as f64 / time / 1e3;
            assert!((algbw - want).abs() <= 0.01 + want * 0.01, "{row:?}");
            let want_bus = algbw * bus_factor(coll, nranks as f64);
            assert!(
                (busbw - want_bus).abs() <= 0.02 + want_bus * 0.01,
                "{row:?}"
            );
            bw.push(busbw);
        }
    }
    assert_eq!(t.out_of_bounds, "0 OK");
    let mean = bw.iter().sum::<f64>() / bw.len() as f64;
    assert!((t.avg_busbw - mean).abs() <= 0.01 + mean * 0.01, "{t:#?}");
}

const COLLECTIVES: [(&str, &str, i64); 7] = [
    ("all_reduce", "sum", -1),
    ("all_gather", "none", -1),
    ("reduce_scatter", "sum", -1),
    ("broadcast", "none", 0),
    ("reduce", "sum", 0),
    ("scatter", "none", 0),
    ("all_to_all", "none", -1),
];

#[test]
fn every_collective_checks_out() {
    for (coll, redop, root) in COLLECTIVES {
        let out = perf_emu(coll, "-t 3 -b 8 -e 4K -f 8 -n 2 -w 1");
        let t = parse(&ok(&out, coll), "");
        check_table(&t, coll, &[8, 64, 512, 4096], 3, redop, root);
        assert!(
            t.comments
                .iter()
                .any(|c| c.contains("3 as threads") && c.contains("emu"))
        );
    }
}

#[test]
fn roots_and_device_buffers() {
    for coll in ["reduce", "scatter", "broadcast"] {
        let out = perf_emu(coll, "-t 3 -r 2 -b 1K -e 1K -n 1 -w 0 --buffers device");
        let redop = if coll == "reduce" { "sum" } else { "none" };
        check_table(&parse(&ok(&out, coll), ""), coll, &[1024], 3, redop, 2);
    }
    for coll in ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"] {
        let out = perf_emu(coll, "-t 2 -b 8 -e 2K -f 16 -n 1 -w 1 --buffers device");
        let redop = if coll.starts_with("all_r") || coll.starts_with("reduce") {
            "sum"
        } else {
            "none"
        };
        check_table(
            &parse(&ok(&out, coll), ""),
            coll,
            &[8, 128, 2048],
            2,
            redop,
            -1,
        );
    }
}

#[test]
fn every_type_and_op() {
    let out = perf_emu("all_reduce", "-t 3 -d all -o all -b 96 -e 96 -n 1 -w 0");
    let t = parse(&ok(&out, "-d all -o all"), "");
    assert_eq!(t.rows.len(), 12 * 5);
    let mut seen = std::collections::BTreeSet::new();
    for r in &t.rows {
        assert!(r.groups.iter().all(|g| g.3 == Some(0)), "{r:?}");
        seen.insert((r.dtype.clone(), r.redop.clone()));
    }
    assert_eq!(seen.len(), 60);
    for d in [
        "float", "double", "half", "bfloat16", "f8e4m3", "f8e5m2", "int8", "uint64",
    ] {
        for o in ["sum", "prod", "min", "max", "avg"] {
            assert!(seen.contains(&(d.to_owned(), o.to_owned())), "{d} {o}");
        }
    }
    assert_eq!(t.out_of_bounds, "0 OK");
    // reduce_scatter with avg on an 8-bit float and 4 ranks (1 ulp away is still right).
    let out = perf_emu(
        "reduce_scatter",
        "-t 4 -d f8e5m2 -o avg -b 1K -e 1K -n 1 -w 0",
    );
    let t = parse(&ok(&out, "reduce_scatter avg f8e5m2"), "");
    assert_eq!(t.rows.len(), 1);
    assert!(t.rows[0].groups.iter().all(|g| g.3 == Some(0)));
}

#[test]
fn every_type_and_op_of_every_collective_through_device_buffers() {
    for (coll, redop, _) in COLLECTIVES {
        let out = perf_emu(
            coll,
            "-t 3 -r 2 -d all -o all -b 8 -e 4K -f 512 -n 1 -w 0 --buffers device",
        );
        let t = parse(&ok(&out, coll), "");
        let ops = if redop == "none" { 1 } else { 5 };
        assert_eq!(t.rows.len(), 12 * ops * 2, "{coll}");
        for r in &t.rows {
            assert!(r.groups.iter().all(|g| g.3 == Some(0)), "{coll}: {r:?}");
        }
        assert_eq!(t.out_of_bounds, "0 OK");
    }
}

/// sendrecv with one rank (send to and receive from itself), every type.
#[test]
fn sendrecv_to_self() {
    let out = perf_emu("sendrecv", "-t 1 -b 8 -e 4K -f 8 -n 2 -w 1");
    check_table(
        &parse(&ok(&out, "sendrecv"), ""),
        "sendrecv",
        &[8, 64, 512, 4096],
        1,
        "none",
        -1,
    );
    let out = perf_emu(
        "sendrecv",
        "-t 1 -d all -b 1K -e 1K -n 1 -w 0 --buffers device",
    );
    let t = parse(&ok(&out, "sendrecv -d all"), "");
    assert_eq!(t.rows.len(), 12);
    assert_eq!(t.out_of_bounds, "0 OK");
}

/// nccl-tests' sendrecv ring on 3 ranks, out of place and in place (the send and the receive of
/// one group on the same memory, as nccl-tests runs it: one exchange operation).
#[test]
fn sendrecv_ring() {
    for buffers in ["window", "device"] {
        let out = perf_emu(
            "sendrecv",
            &format!("-t 3 -b 8 -e 1M -f 8 -n 2 -w 1 --buffers {buffers}"),
        );
        let sizes = [8, 64, 512, 4096, 32768, 262144];
        check_table(
            &parse(&ok(&out, "sendrecv"), ""),
            "sendrecv",
            &sizes,
            3,
            "none",
            -1,
        );
    }
}

#[test]
fn checks_off_show_na() {
    let out = perf_emu("all_gather", "-t 2 -c 0 -b 64 -e 256 -f 4 -n 1 -w 0");
    let t = parse(&ok(&out, "-c 0"), "");
    assert_eq!(t.rows.len(), 2);
    assert!(
        t.rows
            .iter()
            .all(|r| r.groups.iter().all(|g| g.3.is_none()))
    );
    assert_eq!(t.out_of_bounds, "0 OK");
}

#[test]
fn json_output() {
    let out = perf_emu("all_gather", "-t 2 -b 64 -e 1K -f 4 -n 1 -w 0 --json");
    let stdout = ok(&out, "--json");
    let v: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{stdout}"));
    assert_eq!(v["collective"], "all_gather");
    assert_eq!(v["nranks"], 2);
    assert_eq!(v["backend"], "emu");
    assert_eq!(v["dtype"], "float");
    assert_eq!(v["op"], "none");
    assert_eq!(v["wrong"], 0);
    let rows = v["rows"].as_array().unwrap();
    let sizes: Vec<u64> = rows.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [64, 256, 1024]);
    let mut bw = Vec::new();
    for r in rows {
        assert_eq!(
            r["count"].as_u64().unwrap() * 2 * 4,
            r["size"].as_u64().unwrap()
        );
        assert_eq!(r["type"], "float");
        assert_eq!(r["redop"], "none");
        assert_eq!(r["root"], -1);
        assert!(r["algorithm"].as_str().is_some_and(|a| !a.is_empty()));
        for place in ["out_of_place", "in_place"] {
            let p = &r[place];
            assert_eq!(p["wrong"], 0, "{r}");
            let time = p["time_us"].as_f64().unwrap();
            let algbw = p["algbw"].as_f64().unwrap();
            let busbw = p["busbw"].as_f64().unwrap();
            assert!(time > 0.0);
            let want = r["size"].as_f64().unwrap() / time / 1e3;
            assert!((algbw - want).abs() <= want * 1e-9);
            assert!((busbw - algbw * 0.5).abs() <= algbw * 1e-9);
            bw.push(busbw);
        }
    }
    let mean = bw.iter().sum::<f64>() / bw.len() as f64;
    assert!((v["avg_busbw"].as_f64().unwrap() - mean).abs() <= mean * 1e-9);
}

#[test]
fn bad_arguments_exit_2() {
    let cases: [(&[&str], &str); 6] = [
        (&["perf", "all_reduce_sum"], "unknown collective"),
        (&["perf", "-b", "1K", "-e", "8"], "-b must not exceed -e"),
        (&["perf", "-d", "float7"], "unknown datatype"),
        (&["perf", "-o", "xor"], "unknown op"),
        (&["perf", "-t", "0"], "nthreads"),
        (
            &["perf", "broadcast", "-t", "2", "-r", "2", "--device", "emu"],
            "root 2 is out of range",
        ),
    ];
    for (args, msg) in cases {
        let out = symcomm(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(msg), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty() || !text(&out.stdout).contains("Avg bus bandwidth"));
    }
}

#[test]
fn ranks_as_processes() {
    let out = Command::new(SYMCOMM)
        .args([
            "launch",
            "-n",
            "2",
            "--timeout",
            "120",
            "--",
            SYMCOMM,
            "perf",
            "all_reduce",
            "-b",
            "8",
            "-e",
            "1K",
            "-n",
            "2",
            "-w",
            "1",
            "--device",
            "emu",
        ])
        .stdin(Stdio::null())
        .env_remove("SYMCOMM_ID")
        .env_remove("RANK")
        .env("SYMCOMM_LOG", "error")
        .output()
        .unwrap();
    let stdout = ok(&out, "launch -n 2 perf");
    // Only rank 0 prints; the default -f on the emulator is 4.
    let t = parse(&stdout, "[0] ");
    check_table(&t, "all_reduce", &[8, 32, 128, 512], 2, "sum", -1);
    assert!(
        t.comments.iter().any(|c| c.contains("2 as processes")),
        "{stdout}"
    );
}

/// `--copy-bandwidth`: a device-to-device copy reference after the table and in the JSON.
#[test]
fn copy_bandwidth_reference() {
    let flags = "-t 2 -b 1K -e 64K -f 8 -n 2 -w 1 --copy-bandwidth";
    let table = ok(&perf_emu("all_reduce", flags), "copy bandwidth");
    let line = table
        .lines()
        .find(|l| l.starts_with("# Device copy bandwidth:"))
        .unwrap_or_else(|| panic!("no copy bandwidth line in:\n{table}"));
    let gbps: f64 = line.split_whitespace().nth(4).unwrap().parse().unwrap();
    assert!(gbps > 0.0, "{line}");
    let json = perf_emu("all_reduce", &format!("{flags} --json"));
    let v: serde_json::Value = serde_json::from_str(&ok(&json, "json")).unwrap();
    assert!(v["copy_bandwidth_gbps"].as_f64().unwrap() > 0.0, "{v}");
}
