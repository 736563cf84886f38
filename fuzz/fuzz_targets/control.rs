//! The control plane's payload decoders (`comm/payload.rs`): what a rank contributes to each
//! host-side all-gather step (statuses, devices, the local leader's socket name, allocation
//! requests, lane proposals), as a peer — or anyone who got past the bootstrap's
//! authentication — could send it. The first byte picks the step, the rest is the
//! contribution. Properties: no input panics; a contribution that decodes re-encodes to the
//! same bytes (one encoding per value) and decodes again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use symcomm::testing::wire::{CONTROL_TAGS, control_round_trip};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, payload)) = data.split_first() else {
        return;
    };
    let tag = CONTROL_TAGS[usize::from(pick) % CONTROL_TAGS.len()];
    let again = control_round_trip(tag, payload).expect("every listed tag has a decoder");
    if let Ok(bytes) = again {
        assert_eq!(bytes, payload, "tag {tag:#x}: re-encoded differently");
        let twice = control_round_trip(tag, &bytes)
            .expect("listed")
            .expect("re-encoded decodes");
        assert_eq!(twice, bytes);
    }
});
