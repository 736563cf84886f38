//! Reading PTX text: the kernels it defines and the functions it calls but does not define.
//! Used by the build helper (Rust kernel crates, `build::rust`) and by tests that check a
//! built image.

/// `.entry` names of a PTX file.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l
                .strip_prefix(".visible .entry ")
                .or_else(|| l.strip_prefix(".entry "))?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '$')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// Functions a PTX file calls but does not define (`.extern .func [(.param ... retval)] name`).
pub fn ptx_extern_functions(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let mut rest = l.trim().strip_prefix(".extern .func")?.trim_start();
            if rest.starts_with('(') {
                rest = rest[rest.find(')')? + 1..].trim_start();
            }
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '$')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_entries_and_extern_functions() {
        let ptx = ".version 7.0\n.extern .func  (.param .b32 func_retval0) symcomm_rs_barrier\n(\n\t.param .b64 p0\n)\n;\n.extern .func core_panic\n(\n.param .b64 x\n);\n.visible .entry k1(\n\t.param .u64 a\n)\n{\n}\n.entry k_2(\n)\n";
        assert_eq!(ptx_entries(ptx), ["k1", "k_2"]);
        assert_eq!(
            ptx_extern_functions(ptx),
            ["symcomm_rs_barrier", "core_panic"]
        );
    }
}
