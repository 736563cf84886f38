//! Every bootstrap frame decoder, fed a byte stream as a socket would deliver it: the first two
//! bytes choose the receiver's rank count (the length limits and the all-gather's count depend
//! on it), the rest is a sequence of frames. Properties: no input panics or allocates beyond
//! the frame's length limit; every frame that decodes encodes back to the same bytes (except
//! the ignored tail of another version's hello or challenge) and decodes again to the same
//! message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use symcomm::testing::wire;

fuzz_target!(|data: &[u8]| {
    let Some((n, mut rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    let nranks = 1 + u32::from(u16::from_be_bytes(*n)) % 1024;
    while !rest.is_empty() {
        let Ok((message, used)) = wire::decode(rest, nranks) else {
            return;
        };
        let again = message
            .encode()
            .expect("a decoded message has valid wire codes");
        if message.bytes_round_trip() {
            assert_eq!(again, rest[..used], "{message:?} re-encodes differently");
        }
        let (twice, used_twice) = wire::decode(&again, nranks).expect("a re-encoded frame decodes");
        assert_eq!(twice, message);
        assert_eq!(used_twice, again.len());
        rest = &rest[used..];
    }
});
