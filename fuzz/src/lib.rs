//! Checks shared by the fuzz targets.

/// The runs of 8 or more hex digits in `shown` that hold 8 consecutive characters of `secret`
/// (case-insensitive), each as the 8-character window found. Linear in `shown` (messages rarely
/// hold long hex runs, so the windows are looked at only where one is).
pub fn secret_windows(secret: &str, shown: &str) -> Vec<String> {
    let secret = secret.to_ascii_lowercase();
    let mut found = Vec::new();
    for run in shown
        .split(|c: char| !c.is_ascii_hexdigit())
        .filter(|r| r.len() >= 8)
    {
        let run = run.to_ascii_lowercase();
        for i in 0..=run.len() - 8 {
            let w = &run[i..i + 8];
            if secret.contains(w) {
                found.push(w.to_owned());
            }
        }
    }
    found
}
