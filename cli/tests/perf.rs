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
    /// The `--algo-column` column.
    algo: Option<String>,
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

/// Parses nccl-tests output (lines optionally prefixed by `prefix`): rows of exactly
/// nccl-tests' 13 columns, or 14 when the header has `--algo-column`'s `algo`.
fn parse(stdout: &str, prefix: &str) -> Table {
    let mut comments = Vec::new();
    let mut rows = Vec::new();
    let mut columns = 13;
    for line in stdout.lines() {
        let line = line
            .strip_prefix(prefix)
            .unwrap_or_else(|| panic!("line without {prefix:?}: {line:?}"));
        if line.starts_with('#') {
            if line.contains("#wrong") && line.trim_end().ends_with("algo") {
                columns = 14;
            }
            comments.push(line.to_owned());
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            f.len(),
            columns,
            "nccl-tests' 13 columns (+ algo): {line:?}"
        );
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
            algo: f.get(13).map(|a| (*a).to_owned()),
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

/// nccl-tests' (size, count) for a requested size: per-rank-block collectives give each rank
/// `size / tsize / nranks` elements rounded down to 16 bytes (`& ~(16 / tsize - 1)`).
fn expected_shape(coll: &str, size: u64, tsize: u64, nranks: u64) -> (u64, u64) {
    let elems = size / tsize;
    match coll {
        "all_gather" | "reduce_scatter" | "scatter" | "all_to_all" => {
            let count = (elems / nranks) & !(16 / tsize - 1);
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
                    "#wrong", "time", "algbw", "busbw", "#wrong"
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
        assert!(row.algo.is_none(), "no algo column by default: {row:?}");
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
fn bad_arguments_exit_6() {
    let cases: [(&[&str], &str); 12] = [
        (&["perf", "all_reduce_sum"], "unknown collective"),
        (&["perf", "-b", "1K", "-e", "8"], "-b must not exceed -e"),
        (&["perf", "-d", "float7"], "unknown datatype"),
        (&["perf", "-o", "xor"], "unknown op"),
        (&["perf", "-t", "0"], "nthreads"),
        (
            &["perf", "broadcast", "-t", "2", "-r", "2", "--device", "emu"],
            "root 2 is out of range",
        ),
        (
            &["perf", "-g", "2"],
            "-g 2: symcomm drives one GPU per rank",
        ),
        (&["perf", "-r", "-2"], "-2"),
        (
            &["perf", "-z", "1", "-G", "1"],
            "graph capture (-G 1) cannot",
        ),
        (&["perf", "-a", "4"], "average"),
        (&["perf", "-J", "out.txt"], "must end in .json"),
        (&["perf", "--bogus"], "--bogus"),
    ];
    for (args, msg) in cases {
        let out = symcomm(args);
        let stderr = text(&out.stderr);
        // nccl-tests' testInvalidUsage.
        assert_eq!(out.status.code(), Some(6), "{args:?}: {stderr}");
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

/// `symcomm perf COLL FLAGS --device emu` with extra environment variables.
fn perf_emu_env(coll: &str, flags: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(SYMCOMM);
    cmd.arg("perf")
        .arg(coll)
        .args(flags.split_whitespace())
        .args(["--device", "emu"])
        .stdin(Stdio::null())
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("SYMCOMM_ID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("PMI_RANK")
        .env_remove("SYMCOMM_ALGO")
        .env_remove("NCCL_TESTS_MIN_BW")
        .env("SYMCOMM_LOG", "error");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The `# nThread ...` line's value after `key` (`iters:`, `agg iters:`, `graph:`, ...).
fn header_value(t: &Table, key: &str) -> String {
    let line = t
        .comments
        .iter()
        .find(|c| c.starts_with("# nThread"))
        .unwrap_or_else(|| panic!("no # nThread line in {:#?}", t.comments));
    let needle = format!(" {key} ");
    let at = line
        .match_indices(&needle)
        .map(|(i, _)| i)
        // `iters:` alone, not the end of `warmup iters:` / `agg iters:`.
        .find(|&i| !(line[..i].ends_with(" warmup") || line[..i].ends_with(" agg")))
        .unwrap_or_else(|| panic!("no {key} in {line}"));
    line[at + needle.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// nccl-tests' trimming of per-rank counts to 16 bytes, for 1- and 8-byte types: 88 bytes on 3
/// ranks are 29 int8 per rank (16 after trimming) or 3 doubles (2).
#[test]
fn per_rank_counts_trimmed_to_16_bytes() {
    for coll in ["all_gather", "reduce_scatter", "scatter", "all_to_all"] {
        // 88 B on 3 ranks: 29 int8 (16 trimmed), 3 doubles (2), 14 halves (8).
        for (dtype, tsize, first) in [("int8", 1, 16), ("double", 8, 2), ("half", 2, 8)] {
            let out = perf_emu(coll, &format!("-t 3 -d {dtype} -b 88 -e 2K -f 4 -n 1 -w 0"));
            let t = parse(&ok(&out, coll), "");
            assert_eq!(t.rows.len(), 3, "{coll} {dtype}");
            for (row, size) in t.rows.iter().zip([88, 352, 1408]) {
                assert_eq!(
                    (row.size, row.count),
                    expected_shape(coll, size, tsize, 3),
                    "{coll} {dtype}: {row:?}"
                );
                assert_eq!(row.count % (16 / tsize), 0, "{row:?}");
                assert!(row.groups.iter().all(|g| g.3 == Some(0)), "{row:?}");
            }
            assert_eq!(t.rows[0].count, first, "{coll} {dtype}");
        }
    }
}

/// `-g 1` is accepted (one GPU per rank); other values are refused (see bad_arguments_exit_6).
#[test]
fn one_gpu_per_rank() {
    let out = perf_emu("all_reduce", "-t 2 -g 1 -b 64 -e 64 -n 1 -w 0");
    let t = parse(&ok(&out, "-g 1"), "");
    assert_eq!(t.rows.len(), 1);
    assert_eq!(header_value(&t, "nGpus"), "1");
}

/// An option given twice takes its last value, as with nccl-tests' getopt.
#[test]
fn repeated_options_take_the_last_value() {
    let out = perf_emu(
        "all_reduce",
        "-t 2 -b 8 -b 128 -e 64K -e 256 -n 5 -n 1 -w 3 -w 0 -f 8 -f 2 -d int8 -d float",
    );
    let t = parse(&ok(&out, "repeated options"), "");
    let sizes: Vec<u64> = t.rows.iter().map(|r| r.size).collect();
    assert_eq!(sizes, [128, 256]);
    assert!(t.rows.iter().all(|r| r.dtype == "float"));
    assert_eq!(header_value(&t, "minBytes"), "128");
    assert_eq!(header_value(&t, "maxBytes"), "256");
    assert_eq!(header_value(&t, "iters:"), "1");
    assert_eq!(header_value(&t, "step:"), "2(factor)");
}

/// `-r -1`: the sweep once per root, roots in turn (nccl-tests' order), each checked; without
/// a root the collective runs once with root -1.
#[test]
fn every_root() {
    for coll in ["broadcast", "reduce", "scatter"] {
        let out = perf_emu(coll, "-t 3 -r -1 -b 64 -e 1K -f 16 -n 1 -w 1");
        let t = parse(&ok(&out, coll), "");
        let got: Vec<(i64, u64)> = t.rows.iter().map(|r| (r.root, r.size)).collect();
        let sizes = [64, 1024].map(|s| expected_shape(coll, s, 4, 3).0);
        let want: Vec<(i64, u64)> = (0..3).flat_map(|root| sizes.map(|s| (root, s))).collect();
        assert_eq!(got, want, "{coll}");
        assert!(
            t.rows
                .iter()
                .all(|r| r.groups.iter().all(|g| g.3 == Some(0))),
            "{coll}: {:#?}",
            t.rows
        );
    }
    let out = perf_emu("all_reduce", "-t 3 -r -1 -b 64 -e 64 -n 1 -w 0");
    let t = parse(&ok(&out, "all_reduce -r -1"), "");
    assert_eq!(t.rows.len(), 1);
    assert_eq!(t.rows[0].root, -1);
}

/// The timing options: -m (calls per iteration), -z (each blocking mode), -G (graph launches,
/// checks replayed from a graph too), -a (each way to combine the ranks' times), -C (CPU
/// time); every collective's results stay right.
#[test]
fn timing_options() {
    let runs = [
        ("-m 3", "agg iters:", "3"),
        ("-z 1 -m 2", "agg iters:", "2"),
        ("-z 2", "graph:", "0"),
        ("-z 3", "graph:", "0"),
        ("-G 3", "graph:", "3"),
        ("-G 2 -m 2 --buffers device", "graph:", "2"),
        ("-a 0", "iters:", "2"),
        ("-a 2", "iters:", "2"),
        ("-a 3", "iters:", "2"),
        ("-C 1", "iters:", "2"),
    ];
    for (flags, key, value) in runs {
        for coll in ["all_reduce", "all_gather", "reduce", "sendrecv"] {
            let out = perf_emu(
                coll,
                &format!("-t 3 -r 1 -b 64 -e 4K -f 64 -n 2 -w 1 {flags}"),
            );
            let t = parse(&ok(&out, &format!("{coll} {flags}")), "");
            assert_eq!(t.rows.len(), 2, "{coll} {flags}");
            assert_eq!(header_value(&t, key), value, "{coll} {flags}");
            for r in &t.rows {
                for g in r.groups {
                    assert_eq!(g.3, Some(0), "{coll} {flags}: {r:?}");
                    assert!(g.0 > 0.0, "{coll} {flags}: {r:?}");
                }
            }
            let has = |s: &str| t.comments.iter().any(|c| c.contains(s));
            match flags.split_whitespace().take(2).collect::<Vec<_>>()[..] {
                ["-z", "1"] => assert!(has("wait and barrier after each inner iteration")),
                ["-z", "2"] => assert!(has("no barrier")),
                ["-z", "3"] => assert!(has("time excludes barrier")),
                ["-a", "0"] => assert!(has("# time: rank 0's")),
                ["-a", "2"] => assert!(has("# time: minimum over ranks")),
                ["-a", "3"] => assert!(has("# time: maximum over ranks")),
                ["-C", "1"] => assert!(
                    t.comments.iter().any(|c| c
                        .split_whitespace()
                        .filter(|w| *w == "cputime")
                        .count()
                        == 2),
                    "{:#?}",
                    t.comments
                ),
                _ => assert!(has("# time: mean over ranks")),
            }
        }
    }
}

/// `-N 2`: the sweep twice; `-N 0`: until interrupted (rows keep coming).
#[test]
fn run_cycles() {
    let out = perf_emu("all_reduce", "-t 2 -N 2 -b 64 -e 1K -f 16 -n 1 -w 0");
    let t = parse(&ok(&out, "-N 2"), "");
    let sizes: Vec<u64> = t.rows.iter().map(|r| r.size).collect();
    assert_eq!(sizes, [64, 1024, 64, 1024]);
    let mut child = Command::new(SYMCOMM)
        .args([
            "perf",
            "all_reduce",
            "-t",
            "2",
            "-N",
            "0",
            "-b",
            "64",
            "-e",
            "64",
        ])
        .args(["-n", "1", "-w", "0", "-c", "0", "--device", "emu"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .env_remove("RANK")
        .env_remove("SYMCOMM_ID")
        .env("SYMCOMM_LOG", "error")
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut rows = 0;
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if !line.starts_with('#') && !line.trim().is_empty() {
                rows += 1;
                if rows == 10 {
                    break;
                }
            }
        }
        rows
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !reader.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let still_running = child.try_wait().unwrap().is_none();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        reader.is_finished(),
        "-N 0 printed fewer than 10 rows in 30 s"
    );
    assert_eq!(reader.join().unwrap(), 10);
    assert!(still_running, "-N 0 stopped by itself");
}

/// `--algo-column` appends the algorithm; without it rows end with the in-place #wrong, so
/// scripts reading fields from the end see nccl-tests' columns.
#[test]
fn algo_column_only_on_request() {
    let out = perf_emu(
        "all_reduce",
        "-t 2 -b 64 -e 1K -f 16 -n 1 -w 0 --algo-column",
    );
    let t = parse(&ok(&out, "--algo-column"), "");
    assert_eq!(t.rows.len(), 2);
    assert!(
        t.rows
            .iter()
            .all(|r| r.algo.as_deref().is_some_and(|a| !a.is_empty()))
    );
    let out = perf_emu("all_reduce", "-t 2 -b 64 -e 1K -f 16 -n 1 -w 0");
    let stdout = ok(&out, "default");
    for line in stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 13, "{line}");
        assert_eq!(f[f.len() - 1], "0", "in-place #wrong last: {line}");
    }
}

/// `NCCL_TESTS_MIN_BW`: below 0.9 × it the average line says FAILED and the exit status is
/// nccl-tests' testNumResults (7); at or above, OK and 0; not a number, a usage error.
#[test]
fn min_bandwidth() {
    let flags = "-t 2 -b 64 -e 1K -f 16 -n 1 -w 0";
    let out = perf_emu_env("all_reduce", flags, &[("NCCL_TESTS_MIN_BW", "1e9")]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let avg = stdout
        .lines()
        .find(|l| l.starts_with("# Avg bus bandwidth"))
        .unwrap();
    assert!(avg.ends_with(" FAILED"), "{avg}");
    assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
    let out = perf_emu_env("all_reduce", flags, &[("NCCL_TESTS_MIN_BW", "0")]);
    let stdout = ok(&out, "MIN_BW 0");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("# Avg bus bandwidth") && l.ends_with(" OK"))
    );
    let out = perf_emu_env(
        "all_reduce",
        &format!("{flags} --json"),
        &[("NCCL_TESTS_MIN_BW", "1e9")],
    );
    assert_eq!(out.status.code(), Some(7));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["min_bw_ok"], false);
    let out = perf_emu_env("all_reduce", flags, &[("NCCL_TESTS_MIN_BW", "fast")]);
    assert_eq!(out.status.code(), Some(6));
    assert!(text(&out.stderr).contains("NCCL_TESTS_MIN_BW"));
}

/// `-J FILE.json`: nccl-tests' JSON report beside the table (which still prints); an existing
/// file is kept and FILE.json.0 written instead.
#[test]
fn json_file_beside_the_table() {
    let dir = std::env::temp_dir().join(format!("symcomm-perf-json-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("report.json");
    let flags = format!(
        "-t 3 -r -1 -b 64 -e 1K -f 16 -n 2 -w 0 -C 1 -J {}",
        path.display()
    );
    let out = perf_emu_env(
        "reduce",
        &flags,
        &[("SYMCOMM_SECRET", "0123456789abcdef0123456789abcdef")],
    );
    let t = parse(&ok(&out, "-J"), "");
    assert_eq!(t.rows.len(), 6);
    assert!(
        t.comments
            .iter()
            .any(|c| c.starts_with("# Writing JSON output to "))
    );
    let text_json = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text_json.contains("0123456789abcdef"),
        "the secret is redacted"
    );
    let v: serde_json::Value = serde_json::from_str(&text_json).unwrap();
    assert_eq!(v["version"], 3);
    let cfg = &v["config"];
    assert_eq!(cfg["nthreads"], 3);
    assert_eq!(cfg["ngpus"], 1);
    assert_eq!(cfg["minimum_bytes"], 64);
    assert_eq!(cfg["maximum_bytes"], 1024);
    assert_eq!(cfg["step_factor"], 16);
    assert_eq!(cfg["iterations"], 2);
    assert_eq!(cfg["aggregated_iterations"], 1);
    assert_eq!(cfg["graph"], 0);
    assert_eq!(cfg["blocking_collectives"], false);
    assert_eq!(cfg["devices"].as_array().unwrap().len(), 3);
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 6);
    for (r, row) in results.iter().zip(&t.rows) {
        assert_eq!(r["size"], row.size);
        assert_eq!(r["count"], row.count);
        assert_eq!(r["type"], "float");
        assert_eq!(r["redop"], "sum");
        assert_eq!(r["root"], format!("{:6}", row.root));
        assert_eq!(r["actual_iterations"], 2);
        for (place, g) in ["out_of_place", "in_place"].iter().zip(row.groups) {
            let p = &r[*place];
            assert_eq!(p["nwrong"], 0.0, "{r}");
            assert!(
                p["cpu_time"].as_f64().unwrap() > 0.0,
                "-C 1: cpu_time ({r})"
            );
            assert!(p.get("time").is_none());
            assert!((p["alg_bw"].as_f64().unwrap() - g.1).abs() <= 0.01 + g.1 * 0.01);
            assert!(p["bus_bw"].as_f64().is_some());
        }
    }
    assert_eq!(v["out_of_bounds"]["count"], 0);
    assert_eq!(v["out_of_bounds"]["okay"], true);
    assert_eq!(v["average_bus_bandwidth"]["okay"], "unchecked");
    let bw = v["average_bus_bandwidth"]["bandwidth"].as_f64().unwrap();
    assert!((bw - t.avg_busbw).abs() <= 0.01 + bw * 0.01);
    assert!(v["args"].as_array().unwrap().iter().any(|a| a == "-J"));
    assert!(v["start_time"].as_str().unwrap().len() == 19);
    // The file is not overwritten.
    ok(&perf_emu_env("reduce", &flags, &[]), "-J again");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text_json);
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json.0")).unwrap()).unwrap();
    assert_eq!(again["results"].as_array().unwrap().len(), 6);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// nccl-tests' exit codes for failures: a rendezvous that times out is testTimeout (4), a
/// communicator that cannot be created testNcclError (3).
#[test]
fn failure_exit_codes() {
    let port = symcomm::bootstrap::free_port(std::net::Ipv4Addr::LOCALHOST.into())
        .unwrap()
        .to_string();
    let launched = |env: &[(&str, &str)]| {
        let mut cmd = Command::new(SYMCOMM);
        cmd.args(["perf", "-b", "8", "-e", "8", "--device", "emu"])
            .stdin(Stdio::null())
            .env_remove("SYMCOMM_ID")
            .env_remove("SYMCOMM_SECRET")
            .env("RANK", "0")
            .env("WORLD_SIZE", "2")
            .env("SYMCOMM_LOG", "error");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let out = launched(&[
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", &port),
        ("SYMCOMM_SECRET", "0123456789abcdef0123456789abcdef"),
        ("SYMCOMM_INIT_TIMEOUT", "1s"),
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("timed out"));
    let out = launched(&[("SYMCOMM_ID", "garbage")]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("SYMCOMM_ID"));
}
